"""Faults of a run on two processes (`s3r train --coordinator ...`, 2 simulated CPU devices each, gloo, one
fsdp=2,tensor=2 mesh): a killed process, a killed coordinator, SIGTERM to one process, a stopped (SIGSTOP)
process, a kill during a save, and resuming on fewer processes. Each case checks that no process runs past
its deadline (a subprocess timeout here is a failure, never a pass), that each prints at most a few console
lines with the documented exit code, that nothing is lost beyond the last checkpoint every process completed,
and that the resumed losses equal those of an uninterrupted run on the same mesh.

The watch itself (deadlines, agreement, the line) is tested in one process in tests/train/test_peers.py;
`python scripts/fault_pass_distributed.py` runs these cases and prints the tally."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.distributed.conftest import REPO, device_env
from tests.faults.conftest import write_corpus

pytestmark = pytest.mark.slow

PEER_TIMEOUT_S = 10  # --peer-timeout of every case: a lost process is found within this (plus a poll)
STEPS, CKPT_EVERY = 16, 4
START_S = 420  # a start on two loaded cores: imports, the compile (or the cache), step 0
END_S = PEER_TIMEOUT_S + 25  # after a fault, every process must be gone within this
EXIT_PEER_LOST, EXIT_INTERRUPTED = 75, 130


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Job:
  """`s3r train` as processes 0..n-1 of one run (each in a session of its own, killed whole at the end)."""

  def __init__(self, data: dict, out: pathlib.Path, *extra: str, processes: int = 2, devices: int = 2):
    self.out, self.procs, self.logs = out, [], []
    port = _free_port()
    for i in range(processes):
      argv = [*_flags(data, out), *extra]
      if processes > 1:
        argv += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes), "--process-id", str(i)]
      stdout, stderr = out.parent / f"{out.name}.{i}.out", out.parent / f"{out.name}.{i}.err"
      self.logs.append((stdout, stderr))
      with open(stdout, "w") as o, open(stderr, "w") as e:
        self.procs.append(
          subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "s3r.cli", *argv],
            env=device_env(devices, S3R_DATA=str(data["root"] / "empty"), TF_CPP_MIN_LOG_LEVEL="2"),
            cwd=REPO,
            stdout=o,
            stderr=e,
            start_new_session=True,
          )
        )

  def wait_for_step(self, step: int, timeout: float = START_S) -> None:
    """Until process 0 logged `step` (every process must be alive until then)."""
    deadline = time.monotonic() + timeout
    metrics = self.out / "metrics.jsonl"
    while time.monotonic() < deadline:
      assert all(p.poll() is None for p in self.procs), self.report()
      if metrics.exists() and len(metrics.read_text().splitlines()) > step:
        return
      time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s\n{self.report()}")

  def wait(self, timeout: float, *, which=None) -> float:
    """Seconds until the processes `which` (default: all) ended; AssertionError (a hang) past `timeout`."""
    t0 = time.monotonic()
    for i in which if which is not None else range(len(self.procs)):
      try:
        self.procs[i].wait(max(0.1, timeout - (time.monotonic() - t0)))
      except subprocess.TimeoutExpired:
        raise AssertionError(f"process {i} still running {timeout} s later (a hang)\n{self.report()}") from None
    return time.monotonic() - t0

  def console(self, i: int) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of process i."""
    return tuple(path.read_text().splitlines() for path in self.logs[i])

  def report(self) -> str:
    return "\n".join(
      f"process {i}: rc {p.poll()}\n{self.logs[i][1].read_text()[-2000:]}" for i, p in enumerate(self.procs)
    )

  def signal(self, i: int, sig: int) -> None:
    os.kill(self.procs[i].pid, sig)

  def close(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        p.wait()


def _flags(data: dict, out: pathlib.Path) -> list[str]:
  return [
    "train",
    "--preset",
    "tiny",
    "--recipe",
    "s3r",
    "--steps",
    str(STEPS),
    "--warmup",
    "2",
    "--batch",
    "4",
    "--seq",
    "32",
    "--vocab",
    "300",
    "--data",
    str(data["corpus"]),
    "--cache-dir",
    str(data["cache"]),
    "--eval-every",
    "100",
    "--eval-batches",
    "1",
    "--ckpt-every",
    str(CKPT_EVERY),
    "--no-progress",
    "--mesh",
    "fsdp=2,tensor=2",
    "--peer-timeout",
    str(PEER_TIMEOUT_S),
    "--out",
    str(out),
  ]


@pytest.fixture
def jobs():
  started: list[Job] = []

  def start(*args, **kwargs) -> Job:
    started.append(Job(*args, **kwargs))
    return started[-1]

  yield start
  for job in started:
    job.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
  root = tmp_path_factory.mktemp("peer_faults")
  (root / "empty").mkdir()
  return {"root": root, "corpus": write_corpus(root / "corpus"), "cache": root / "cache"}


@pytest.fixture(scope="module")
def reference(data) -> list[dict]:
  """The metrics of the uninterrupted two-process run."""
  job = Job(data, data["root"] / "reference")
  try:
    job.wait(2 * START_S)
    assert [p.returncode for p in job.procs] == [0, 0], job.report()
  finally:
    job.close()
  return _metrics(job.out)


def _metrics(out: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _complete(out: pathlib.Path) -> list[int]:
  return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


def _one_error_line(job: Job, i: int, code: int, *fragments: str) -> str:
  """Process i exited with `code` and wrote exactly one line to its console's stderr, naming `fragments`."""
  assert job.procs[i].returncode == code, job.report()
  _, err = job.console(i)
  assert len(err) == 1, job.report()
  for fragment in fragments:
    assert fragment in err[0], err[0]
  return err[0]


def _resume_and_compare(jobs, data, out, reference, *, processes=2, devices=2, exact=True) -> Job:
  """Resumes `out` to the end and compares its losses with the reference's (bitwise on the same processes and
  mesh; on one process the token-mean loss may differ in its last bits); the resumed job."""
  job = jobs(data, out, "--resume", processes=processes, devices=devices)
  job.wait(2 * START_S)
  assert all(p.returncode == 0 for p in job.procs), job.report()
  ours = _metrics(out)
  assert [r["step"] for r in ours] == list(range(STEPS + 1))
  for mine, theirs in zip(ours, reference):
    if exact:
      assert mine["loss"] == theirs["loss"], (mine, theirs)
    else:
      assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5), (mine, theirs)
  return job


def test_a_killed_process_ends_the_other_in_one_line_and_the_run_resumes_exactly(jobs, data, reference, tmp_path):
  out = tmp_path / "run"
  job = jobs(data, out)
  job.wait_for_step(6)
  job.signal(1, signal.SIGKILL)
  took = job.wait(END_S)
  assert took < PEER_TIMEOUT_S + 10
  last = _complete(out)[-1]
  _one_error_line(
    job, 0, EXIT_PEER_LOST, "lost process 1 of 2 at step", f"completed is {out / 'checkpoints' / str(last)};"
  )
  assert not any("Traceback" in line or "[Gloo]" in line for line in job.console(0)[0])  # the runtime's: in the log
  assert _metrics(out)[-1]["step"] >= last
  _resume_and_compare(jobs, data, out, reference)


def test_a_killed_coordinator_ends_the_other_process_and_one_process_resumes(jobs, data, reference, tmp_path):
  out = tmp_path / "run"
  job = jobs(data, out)
  job.wait_for_step(6)
  job.signal(0, signal.SIGKILL)
  assert job.wait(END_S) < PEER_TIMEOUT_S + 10
  _one_error_line(job, 1, EXIT_PEER_LOST, "lost process 0 of 2 (the coordinator)", "--resume")
  assert job.console(1)[0] == []  # process 1 prints nothing else
  _resume_and_compare(jobs, data, out, reference, processes=1, devices=4, exact=False)


def test_sigterm_to_one_process_saves_and_stops_both_at_one_step(jobs, data, reference, tmp_path):
  out = tmp_path / "run"
  job = jobs(data, out)
  job.wait_for_step(5)
  job.signal(1, signal.SIGTERM)
  job.wait(END_S)
  mine = _one_error_line(job, 1, EXIT_INTERRUPTED, "interrupted: SIGTERM at step")
  theirs = _one_error_line(job, 0, EXIT_INTERRUPTED, "interrupted: SIGTERM to process 1 at step")
  step = int(mine.split(" at step ")[1].split(":")[0])
  assert f"at step {step}: saved {out / 'checkpoints' / str(step)}" in theirs
  assert _complete(out)[-1] == step and _metrics(out)[-1]["step"] == step  # nothing lost
  _resume_and_compare(jobs, data, out, reference)


def test_a_stopped_process_is_lost_and_ends_itself_when_it_continues(jobs, data, tmp_path):
  out = tmp_path / "run"
  job = jobs(data, out)
  job.wait_for_step(6)
  job.signal(1, signal.SIGSTOP)
  assert job.wait(END_S, which=[0]) < PEER_TIMEOUT_S + 10
  _one_error_line(job, 0, EXIT_PEER_LOST, "lost process 1 of 2 at step")
  job.signal(1, signal.SIGCONT)
  job.wait(END_S, which=[1])
  _one_error_line(job, 1, EXIT_PEER_LOST, "--resume")


def test_a_kill_during_a_save_resumes_from_the_checkpoint_before_with_a_note(jobs, data, reference, tmp_path):
  out = tmp_path / "run"
  job = jobs(data, out)
  job.wait_for_step(CKPT_EVERY + 1)  # the first checkpoint is complete
  deadline = time.monotonic() + START_S
  while not (saving := list((out / "checkpoints").glob("*.orbax-checkpoint-tmp*"))):
    assert time.monotonic() < deadline and job.procs[0].poll() is None, job.report()
    time.sleep(0.005)
  job.signal(1, signal.SIGKILL)
  cut = int(saving[0].name.split(".")[0])
  job.wait(END_S)
  assert cut not in _complete(out), "the save finished before the kill"
  previous = _complete(out)[-1]
  assert previous == cut - CKPT_EVERY
  _one_error_line(job, 0, EXIT_PEER_LOST, f"completed is {out / 'checkpoints' / str(previous)};")
  unfinished = bool(list((out / "checkpoints").glob(f"{cut}.orbax-checkpoint-tmp*")))
  resumed = _resume_and_compare(jobs, data, out, reference)
  printed = resumed.console(0)[0]
  assert f"resume: restored step {previous} from" in "\n".join(printed)
  assert len([line for line in printed if f"the save of step(s) {cut} was cut short" in line]) == int(unfinished)
  assert not list((out / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
