"""A full disk while a checkpoint is written: one line (exit 3) that says so, no partial folder, and the
previous checkpoint intact. The failure is injected (tests/faults/disk_full/sitecustomize.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.faults.conftest import REPO, assert_one_line_error, metrics_lines

INJECT = REPO / "tests" / "faults" / "disk_full"


def _train_with_full_disk_at(cli, out, step: int, how: str) -> subprocess.CompletedProcess:
  env = {
    **cli.env,
    "PYTHONPATH": f"{INJECT}:{REPO}",
    "S3R_TEST_DISK_FULL_STEP": str(step),
    "S3R_TEST_DISK_FULL_AS": how,
  }
  return subprocess.run(cli.argv(*cli.train_args(out)), capture_output=True, text=True, cwd=REPO, env=env, timeout=240)


@pytest.mark.parametrize("how", ["oserror", "tensorstore"])
def test_a_full_disk_during_a_checkpoint_says_so_in_one_line_and_leaves_the_previous_one_intact(cli, tmp_path, how):
  out = tmp_path / "run"
  proc = _train_with_full_disk_at(cli, out, 4, how)
  line = assert_one_line_error(proc, 3, "disk full", "checkpoint 4", str(out / "checkpoints" / "2"), "--resume")
  assert "device memory" not in line
  assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name != "known_good.json") == ["2"]
  assert json.loads(metrics_lines(out)[-1])["step"] == 4


def test_a_full_disk_at_the_first_save_failing_concurrent_writes_prints_only_its_line(cli, tmp_path):
  """Every write of the save fails: the futures nobody awaited report to the run's train.log only."""
  out = tmp_path / "run"
  proc = _train_with_full_disk_at(cli, out, 2, "concurrent")
  line = assert_one_line_error(proc, 3, "disk full", "checkpoint 2")
  assert "never retrieved" not in proc.stdout + proc.stderr and proc.stderr.endswith(line + "\n"), proc.stderr
  assert "never retrieved" in (out / "train.log").read_text()


@pytest.mark.slow
def test_a_run_stopped_by_a_full_disk_resumes_to_the_uninterrupted_result(cli, tmp_path, base_run):
  out = tmp_path / "run"
  assert _train_with_full_disk_at(cli, out, 4, "oserror").returncode == 3
  resumed = cli("train", "--out", out, "--resume", "--no-progress")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  steady = lambda lines: [{k: r.get(k) for k in ("step", "loss", "lr", "val_loss")} for r in map(json.loads, lines)]
  assert steady(metrics_lines(out)) == steady(metrics_lines(base_run))
