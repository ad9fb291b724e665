"""The watch over the other processes (s3r.train.peers) on the real runtime: two processes of
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
def pair(tmp_path):
  """Starts processes 0 and 1 (each in a session of its own); kills what is left at the end."""
  procs = []
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  for i in range(2):
    procs.append(
      subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path), str(port), str(i), str(PEER_TIMEOUT_S)],
        env=device_env(1, TF_CPP_MIN_LOG_LEVEL="2"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
      )
    )
  yield procs
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
    p.communicate()


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
