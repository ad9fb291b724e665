"""The watch over the other processes (s3r.train.run.peers) on the real runtime: two processes of
tests/distributed/peer_worker.py (jax.distributed, its key-value store, gloo; no model, so each case takes
seconds). A killed coordinator ends the other process in one console line with exit code 75 (through the
runtime's own abort, which the watch turns into its line), and SIGTERM to one process stops both after the
same step. The cases with `s3r train` itself are tests/distributed/test_peer_faults.py (slow)."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.distributed.conftest import REPO, device_env

WORKER = REPO / "tests" / "distributed" / "peer_worker.py"
PEER_TIMEOUT_S = 4
START_S = 120  # two JAX imports and the distributed start on loaded cores


@pytest.fixture
def start_pair(tmp_path):
  """start_pair(*args) starts processes 0 and 1 of peer_worker.py (each in a session of its own; `args`: its
  optional arguments after PEER_TIMEOUT_S); what is left is killed at the end."""
  procs = []

  def start(*extra) -> list[subprocess.Popen]:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    for i in range(2):
      argv = [str(tmp_path), str(port), str(i), str(PEER_TIMEOUT_S), *map(str, extra)]
      procs.append(
        subprocess.Popen(
          [sys.executable, str(WORKER), *argv],
          env=device_env(1, TF_CPP_MIN_LOG_LEVEL="2"),
          cwd=REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          start_new_session=True,
        )
      )
    return procs

  yield start
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
    p.communicate()


@pytest.fixture
def pair(start_pair):
  return start_pair()


def _until_step(tmp_path, procs, step: int) -> None:
  deadline = time.monotonic() + START_S
  while time.monotonic() < deadline:
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    done = [tmp_path / f"step.{i}" for i in range(2)]
    if all(f.exists() and f.read_text() and int(f.read_text()) >= step for f in done):
      return
    time.sleep(0.05)
  raise AssertionError(f"no step {step} within {START_S} s")


def test_a_killed_coordinator_ends_the_other_process_in_one_line_with_exit_code_75(pair, tmp_path):
  _until_step(tmp_path, pair, 5)
  pair[0].kill()
  t0 = time.monotonic()
  out, err = pair[1].communicate(timeout=PEER_TIMEOUT_S + 20)  # a timeout here is a hang: the test fails
  assert time.monotonic() - t0 < PEER_TIMEOUT_S + 10
  assert pair[1].returncode == 75, err
  assert out == "" and len(err.splitlines()) == 1, err
  assert err.startswith("s3r: error: lost process 0 of 2 (the coordinator) at step "), err
  assert err.rstrip().endswith(f"no checkpoint was completed; continue with s3r train --out {tmp_path} --resume")
  assert "Terminating process because the JAX distributed service" in (tmp_path / "train.log.1").read_text()


def test_sigterm_to_one_process_stops_both_after_the_same_step(pair, tmp_path):
  _until_step(tmp_path, pair, 3)
  pair[1].send_signal(signal.SIGTERM)
  results = [p.communicate(timeout=PEER_TIMEOUT_S + 20) for p in pair]
  assert [p.returncode for p in pair] == [130, 130], results
  (zero,), (one,) = (out.splitlines() for out, _ in results)
  step = one.split()[3].rstrip(":")
  assert one == f"stopped after step {step}: SIGTERM"
  assert zero == f"stopped after step {step}: SIGTERM to process 1"
  assert [err for _, err in results] == ["", ""]


HANG_AT = 12


@pytest.mark.slow
def test_a_live_process_whose_collective_never_comes_is_named_by_the_stall_deadline(start_pair, tmp_path):
  """Process 1's main thread blocks after step 12 while its threads beat on: process 0 waits in step 13's
  collective past max(10 x its median step, 2 x --peer-timeout), names process 1, and both end with that line."""
  pair = start_pair(HANG_AT)
  _until_step(tmp_path, pair, HANG_AT)
  t0 = time.monotonic()
  results = [p.communicate(timeout=4 * PEER_TIMEOUT_S + 20) for p in pair]  # a timeout here is a hang
  assert time.monotonic() - t0 < 2 * PEER_TIMEOUT_S + 10
  assert [p.returncode for p in pair] == [75, 75], results
  lines = [err.splitlines() for _, err in results]
  assert all(len(e) == 1 for e in lines) and lines[0] == lines[1], lines  # process 1 ends with process 0's line
  expected = f"s3r: error: process 1 is stuck at step {HANG_AT} (the others are at step {HANG_AT + 1}): at step"
  assert lines[0][0].startswith(expected), lines


@pytest.mark.slow
def test_sigterm_to_both_processes_stops_both_after_the_same_step_each_naming_its_own(pair, tmp_path):
  _until_step(tmp_path, pair, 3)
  for p in pair:
    p.send_signal(signal.SIGTERM)
  results = [p.communicate(timeout=PEER_TIMEOUT_S + 20) for p in pair]
  assert [p.returncode for p in pair] == [130, 130], results
  (zero,), (one,) = (out.splitlines() for out, _ in results)
  assert zero == one and zero.startswith("stopped after step ") and zero.endswith(": SIGTERM"), (zero, one)
