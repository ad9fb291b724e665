"""Interrupts: a second Ctrl-C right after the first, temporary folders of an interrupted save, and
the sweep's report of an interrupted run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from tests.faults.conftest import assert_one_line_error, wait_for_step


def test_a_second_ctrl_c_right_after_the_first_names_an_intact_checkpoint_and_leaves_no_debris(cli, tmp_path):
  out = tmp_path / "run"
  proc = cli.start(*cli.train_args(out, "--steps", "100000", "--eval-every", "50000"))  # a checkpoint every 2 steps
  try:
    wait_for_step(out, 5, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
  line = assert_one_line_error(result, 130, "interrupted", "--resume")
  assert "before training started" not in line and "Event loop is closed" not in stderr
  named = re.search(r"(?:saved|latest intact checkpoint is) (\S+?)[;,]", line)
  assert named, line
  assert not list((out / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
  evaluated = cli("eval", out)
  assert evaluated.returncode == 0 and f"eval: step {named.group(1).rsplit('/', 1)[-1]}" in evaluated.stdout


def test_resume_removes_the_temporary_folder_of_an_interrupted_save(cli, run_copy):
  stale = run_copy / "checkpoints" / "8.orbax-checkpoint-tmp-1234"
  (stale / "state").mkdir(parents=True)
  proc = cli("train", "--out", run_copy, "--resume", "--no-progress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not stale.exists() and (run_copy / "checkpoints" / "6").is_dir()


@pytest.mark.parametrize("code", [130, -signal.SIGTERM])
def test_the_sweep_reports_an_interrupted_run_as_resumable_not_failed(tmp_path, monkeypatch, code):
  from research import sweep
  from research.protocol import SweepConfig

  exit_with = f"import os, signal, sys; os.kill(os.getpid(), signal.SIGTERM) if {code} < 0 else sys.exit({code})"
  monkeypatch.setattr(sweep, "_train_command", lambda *a: [sys.executable, "-c", exit_with])
  cfg = SweepConfig(name="t", recipes=("s3r",), lrs=(0.002,), seeds=1, runs_dir=str(tmp_path / "runs"))
  with pytest.raises(
    sweep.RunInterrupted, match="was interrupted .* resumable: .* running the same sweep command"
  ) as e:
    sweep.run_one(cfg, "s3r", 0.002, 0)
  assert "failed" not in str(e.value)
  assert not (cfg.summary_dir / f"{cfg.run_name('s3r', 0.002, 0)}.json").exists()  # not recorded as finished
