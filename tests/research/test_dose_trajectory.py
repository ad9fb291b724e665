"""The dose along one run's checkpoints: excess arithmetic, refusals, and agreement with the sweep's own dose."""

import json

import pytest

from research import dose_trajectory, runs, sweep
from tests.research.conftest import tiny_sweep_config


def test_excess_is_the_difference_of_squared_errors_to_int8_sr_per_metric():
  errors = {"int8_sr": {"dw_first": 0.2, "embed": 0.1}, "s3r": {"dw_first": 0.3, "embed": 0.1}}
  out = dose_trajectory.excess(errors)
  assert set(out) == {"s3r"}
  assert out["s3r"]["dw_first"] == pytest.approx(0.09 - 0.04) and out["s3r"]["embed"] == pytest.approx(0.0)


def test_recipes_without_the_base_and_a_folder_without_checkpoints_are_refused(tmp_path):
  with pytest.raises(SystemExit, match="must include int8_sr"):
    dose_trajectory.main(["--checkpoints", str(tmp_path), "--out", str(tmp_path / "o"), "--recipes", "s3r"])
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(SystemExit, match="no checkpoints under"):
    dose_trajectory.main(["--checkpoints", str(tmp_path / "checkpoints"), "--out", str(tmp_path / "o")])


@pytest.mark.slow
def test_each_checkpoint_is_measured_and_the_last_reproduces_the_sweeps_dose(tmp_path, tiny_corpus):
  rates = {"int8_sr": 2e-3, "s3r": 2e-3}
  # checkpoints every 2 steps; keep_every=2 keeps step 2, which the rotation (the last two) would drop
  cfg = tiny_sweep_config(
    tmp_path, tiny_corpus, recipes=tuple(rates), fixed_lrs=rates, dose_keys=2, steps=6, keep_every=2
  )
  sweep.sweep(cfg, max_runs=1, only=frozenset({"int8_sr-lr0.002-s0"}), log=lambda m: None)
  (summary,) = runs.load_summaries(cfg).values()
  run_dir = tmp_path / "runs" / "t" / summary["run"]
  out = tmp_path / "traj"
  args = ["--checkpoints", str(run_dir), "--out", str(out), "--recipes", "int8_sr,s3r", "--keys", "2"]
  doc = dose_trajectory.main(args)
  assert sorted(doc["entries"], key=int) == ["2", "4", "6"]
  last = doc["entries"]["6"]
  assert last["errors"] == summary["dose"]["errors"]  # same parameters, batch and keys: the same numbers
  assert last["excess"]["s3r"]["dw_first"] == pytest.approx(
    last["errors"]["s3r"]["dw_first"] ** 2 - last["errors"]["int8_sr"]["dw_first"] ** 2
  )
  assert doc["entries"]["2"]["errors"] != last["errors"]
  md = out.with_suffix(".md").read_text()
  assert "| 2 |" in md and "| 6 |" in md and out.with_suffix(".png").stat().st_size > 0
  # resumable: a second call measures nothing new and keeps the file
  before = json.loads(out.with_suffix(".json").read_text())["entries"]
  assert dose_trajectory.main(args)["entries"] == before
