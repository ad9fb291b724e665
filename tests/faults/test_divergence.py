"""A run that diverges after healthy checkpoints: the guard names the last checkpoint known to be good,
sets the later ones aside (kept, with the metrics), and the run continues from it at a lower peak."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.faults.conftest import REPO, assert_one_line_error, metrics_lines

# a 16-step linear warm-up to lr 0.3, healthy on any CPU; from step 9 the applied rate is 1000x the
# scheduled one (injected: tests/faults/diverge/sitecustomize.py), so the parameters blow up; which rule
# of the guard stops the run, and where, the tests read from the run
STEPS, BLOW_UP = 16, 9
DIVERGING = ["--lr", "0.3", "--steps", str(STEPS), "--warmup", str(STEPS)]
INJECT = REPO / "tests" / "faults" / "diverge"


@pytest.fixture(scope="module")
def diverged(cli, tmp_path_factory):
  out = tmp_path_factory.mktemp("diverged") / "run"
  env = {**cli.env, "PYTHONPATH": f"{INJECT}:{REPO}", "S3R_TEST_DIVERGE_STEP": str(BLOW_UP)}
  argv = cli.argv(*cli.train_args(out, *DIVERGING))
  return out, subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=240)


def test_a_divergence_names_the_known_good_checkpoint_and_sets_the_later_ones_aside(diverged):
  out, proc = diverged
  line = assert_one_line_error(proc, 1, "last checkpoint known to be good", f"s3r train --out {out} --resume --lr")
  good = json.loads((out / "checkpoints" / "known_good.json").read_text())["step"]
  assert str(out / "checkpoints" / str(good)) in line
  assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.is_dir()) == [good]
  stopped = json.loads(metrics_lines(out)[-1])["step"] + 1
  aside = out / "diverged" / str(stopped)
  assert f"moved to {aside}" in line and (aside / "metrics.jsonl").read_text() == (out / "metrics.jsonl").read_text()
  assert all(int(p.name) > good for p in (aside / "checkpoints").iterdir())
  assert good < BLOW_UP <= stopped


def test_resuming_from_the_known_good_checkpoint_at_a_lower_lr_records_the_change_and_keeps_the_schedule(
  cli, diverged, tmp_path
):
  import shutil

  out = tmp_path / "run"
  shutil.copytree(diverged[0], out)
  good = json.loads((out / "checkpoints" / "known_good.json").read_text())["step"]
  before = {r["step"]: r["lr"] for r in map(json.loads, metrics_lines(out))}
  resumed = cli("train", "--out", out, "--resume", "--lr", "0.1", "--no-progress")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"peak learning rate 0.3 -> 0.1 from step {good} on" in resumed.stdout
  assert json.loads((out / "config.json").read_text())["train"]["lr_changes"] == [[good, 0.1]]
  after = {r["step"]: r["lr"] for r in map(json.loads, metrics_lines(out))}
  assert all(after[s] == before[s] for s in range(good + 1))  # the schedule up to the resume step is kept
  assert all(after[s] == pytest.approx(s / STEPS * 0.1, rel=1e-5) for s in range(good + 1, STEPS + 1))  # then scaled
  higher = cli("train", "--out", out, "--resume", "--lr", "0.5", "--steps", str(STEPS + 4))
  assert_one_line_error(higher, 2, "--lr", "may only be lowered")
