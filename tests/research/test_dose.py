"""The dose-response study at the `tiny` preset: complete arms per grid and seed, resumption by
skipping finished arms, the summary's paired differences and excesses against the arms' own
numbers, where its files go, and the report built from a hand-made summary. The tests that train
the study (the `finished` fixture, about a minute) are slow; the config, refusal and report tests
are in the default suite."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import numpy as np
import pytest

from research import dose, dose_paired, dose_report, lockstep

ROOT = pathlib.Path(__file__).resolve().parents[2]
GRIDS = ("nvfp4",)  # the emulated FP4 grid (the study's code is the same for every grid; the grids: tests/quant)
RECIPES = ("int8_sr", "s3r")  # the baseline and the shared-threshold recipe (one arm x two recipes: seconds)
TRAINS_THE_STUDY = pytest.mark.slow  # the tests of the `finished` fixture, which trains the study once (about a minute)


def _cfg(token_folder, root: pathlib.Path, **kw) -> dose.DoseConfig:
  base: dict[str, Any] = dict(
    grids=GRIDS,
    seeds=1,
    recipes=RECIPES,
    preset="tiny",
    steps=3,
    warmup=1,
    batch=2,
    seq=16,
    eval_every=2,
    eval_batches=2,
    dose_keys=1,
    dose_batch=2,
    tokens=str(token_folder),
    runs_dir=str(root / "runs"),
    results_dir=str(root / "results_out"),
  )
  return dose.DoseConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def finished(token_folder, tmp_path_factory):
  """(config, study summary) of a 2-grid x 1-seed x 3-step study, run once for the module."""
  root = tmp_path_factory.mktemp("dose")
  cfg = _cfg(token_folder, root)
  return cfg, dose.study(cfg, log=lambda _: None)


def _arm_summary(cfg, grid, seed=0) -> dict:
  return json.loads((pathlib.Path(cfg.runs_dir) / dose.arm_name(grid, seed) / "summary.json").read_text())


@TRAINS_THE_STUDY
def test_every_arm_is_complete_with_both_gradient_error_measurements(finished):
  cfg, summary = finished
  assert summary["missing_arms"] == [] and [(a["grid"], a["seed"]) for a in summary["arms"]] == [(g, 0) for g in GRIDS]
  for grid in GRIDS:
    arm = _arm_summary(cfg, grid)
    expected = [dose.recipe_at(r, grid) for r in cfg.recipes]
    assert arm["complete"] and arm["stopped_by"] == "steps" and arm["steps_done"] == 3
    assert arm["config"]["recipes"] == expected and set(arm["dose"]) == set(expected)
    assert arm["dose_same_params"]["params_of"] == dose.recipe_at("int8_sr", grid)
    assert set(arm["dose_same_params"]["errors"]) == set(expected)
    assert arm["meta"]["loadavg_after"] is not None or arm["meta"]["loadavg_before"] is None
    assert {"git", "jax_version", "cpu_model", "date_utc"} <= set(arm["meta"])
  assert _arm_summary(cfg, "nvfp4")["config"]["recipes"] == ["int8_sr@nvfp4", "s3r@nvfp4"]


@TRAINS_THE_STUDY
def test_paired_differences_are_the_differences_of_the_final_losses(finished):
  cfg, summary = finished
  for arm in summary["arms"]:
    val = _arm_summary(cfg, arm["grid"])["curves"]["val"]
    base = val[dose.recipe_at("int8_sr", arm["grid"])][-1]
    assert set(arm["gap"]) == {"s3r"}
    for recipe, gap in arm["gap"].items():
      assert gap == pytest.approx(val[dose.recipe_at(recipe, arm["grid"])][-1] - base)
  for grid, rows in summary["grids"].items():
    for recipe, row in rows.items():
      gaps = [a["gap"][recipe] for a in summary["arms"] if a["grid"] == grid]
      assert row["gap"] == gaps and row["gap_mean"] == pytest.approx(np.mean(gaps)) and row["gap_sd"] is None


@TRAINS_THE_STUDY
def test_the_excess_is_the_difference_of_squared_errors_on_the_same_parameters(finished):
  cfg, summary = finished
  for arm in summary["arms"]:
    errors = _arm_summary(cfg, arm["grid"])["dose_same_params"]["errors"]
    e2 = {r.partition("@")[0]: e["dw_first"] ** 2 for r, e in errors.items()}
    assert arm["excess"] == pytest.approx({r: e2[r] - e2["int8_sr"] for r in ("s3r",)})
    assert (
      arm["e2_baseline"] == pytest.approx(e2["int8_sr"]) and arm["excess_own_params"].keys() == arm["excess"].keys()
    )
  assert {(p["recipe"], p["grid"]) for p in summary["points"]} == {("s3r", g) for g in GRIDS}


@TRAINS_THE_STUDY
def test_a_second_call_skips_the_finished_arms(finished, monkeypatch):
  cfg, summary = finished
  stamps = {g: (pathlib.Path(cfg.runs_dir) / dose.arm_name(g, 0) / "summary.json").stat().st_mtime_ns for g in GRIDS}

  def no_training(*args, **kwargs):
    raise AssertionError("a finished arm was trained again")

  monkeypatch.setattr(lockstep, "run", no_training)
  lines = []
  again = dose.study(cfg, log=lines.append)
  assert [line for line in lines if "skipped" in line] == [f"arm {g}-s0: finished, skipped" for g in GRIDS]
  assert again["arms"] == json.loads(json.dumps(summary["arms"]))
  assert stamps == {
    g: (pathlib.Path(cfg.runs_dir) / dose.arm_name(g, 0) / "summary.json").stat().st_mtime_ns for g in GRIDS
  }


@TRAINS_THE_STUDY
def test_an_unfinished_arm_is_trained_again_and_a_finished_one_of_other_settings_refused(finished, tmp_path):
  cfg, _ = finished
  partial = dose.lockstep_config(cfg, GRIDS[0], 0, cfg.tokens)
  summary = json.loads((pathlib.Path(partial.out) / "summary.json").read_text())
  other = dose.lockstep_config(dataclasses.replace(cfg, runs_dir=str(tmp_path)), GRIDS[0], 0, cfg.tokens)
  pathlib.Path(other.out).mkdir(parents=True)
  (pathlib.Path(other.out) / "summary.json").write_text(json.dumps({**summary, "complete": False}))
  assert dose.finished_arm(other) is None
  (pathlib.Path(other.out) / "summary.json").write_text(
    json.dumps({**summary, "config": {**summary["config"], "lr": 1.0}})
  )
  with pytest.raises(ValueError, match="other settings.*lr"):
    dose.finished_arm(other)


@TRAINS_THE_STUDY
def test_the_committed_results_are_written_only_with_results_dir_results(finished, monkeypatch, tmp_path):
  cfg, _ = finished
  monkeypatch.chdir(tmp_path)
  settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "results_dir"}  # the default results_dir
  (tmp_path / "study.json").write_text(json.dumps(settings))
  common = ["--config", str(tmp_path / "study.json"), "--report-only"]
  assert dose.main(common) == 0
  assert (tmp_path / "runs/results/dose.json").is_file() and (tmp_path / "runs/results/dose.md").is_file()
  assert not (tmp_path / "results").exists()
  assert dose.main([*common, "--results-dir", "results"]) == 0
  doc = json.loads((tmp_path / "research/results/dose.json").read_text())
  assert len(doc["arms"]) == len(GRIDS) and doc["missing_arms"] == []


def test_without_a_corpus_the_study_stops_with_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
  (tmp_path / "empty-root").mkdir()
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))
  assert dose.main(["--preset", "tiny", "--runs-dir", str(tmp_path / "runs")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "no enwiki corpus" in err[0] and "--data" in err[0]


def test_the_committed_config_is_the_documented_study():
  cfg = dose.config_from_args(dose.parser().parse_args(["--config", str(ROOT / "research/configs/dose.json")]))
  assert cfg.grids == ("int8", "int6", "int4", "nvfp4") and cfg.seeds == 2 and cfg.preset == "cpu-small"
  assert (cfg.steps, cfg.warmup, cfg.lr, cfg.batch, cfg.seq) == (800, 80, 4e-3, 8, 256)
  assert (cfg.eval_every, cfg.eval_batches) == (100, 64)
  arm = dose.lockstep_config(cfg, "nvfp4", 1, "tokens")
  assert arm.recipes == ("int8_rtne@nvfp4", "int8_sr@nvfp4", "s3r@nvfp4", "s3r_ec_dx@nvfp4") and arm.seed == 1
  assert arm.dose_params_of == "int8_sr@nvfp4" and arm.out.endswith("nvfp4-s1")


def test_the_fp8_arm_config_is_the_study_at_the_fp8_grids_and_nothing_else():
  main, fp8 = (json.loads((ROOT / "research" / "configs" / f).read_text()) for f in ("dose.json", "dose_fp8.json"))
  assert fp8["grids"] == ["e4m3", "e5m2"] and {**fp8, "grids": main["grids"]} == main
  cfg = dose.config_from_args(dose.parser().parse_args(["--config", str(ROOT / "research/configs/dose_fp8.json")]))
  arm = dose.lockstep_config(cfg, "e5m2", 1, "tokens")
  assert arm.recipes == ("int8_rtne@e5m2", "int8_sr@e5m2", "s3r@e5m2", "s3r_ec_dx@e5m2") and arm.seed == 1
  assert (ROOT / "research" / "results" / "dose_fp8" / "PREDICTIONS.md").exists()


def test_the_config_names_the_field_it_rejects():
  cases: list[tuple[dict[str, Any], str]] = [
    (dict(grids=("int5",)), "grids"),
    (dict(baseline="bf16"), "baseline"),
    (dict(seeds=0), "seeds"),
  ]
  for bad, field in cases:
    with pytest.raises(ValueError, match=f"DoseConfig.{field}"):
      dose.DoseConfig(**bad)
  with pytest.raises(ValueError, match="DoseConfig.warmup"):
    dose.DoseConfig(steps=10, warmup=20)


def _hand_made_summary() -> dict:
  arm = lambda grid, seed, gap, excess: {
    "grid": grid,
    "seed": seed,
    "steps_done": 800,
    "val": {"int8_sr": 5.0, "s3r": 5.0 + gap},
    "gap": {"s3r": gap},
    "excess": {"s3r": excess},
    "e2_baseline": 0.03,
    "iteration_s_median": 2.8,
    "meta": {"revision": "abc", "dirty_paths": [], "loadavg_before": [1, 1, 1], "loadavg_after": [2, 2, 2]}
    | {"date_utc": "D", "jax_version": "0", "cpu_model": "cpu"},
  }
  arms = [arm("int8", 0, 0.004, 0.01), arm("int8", 1, -0.002, 0.012), arm("int6", 0, 0.09, 0.15)]
  pts = dose_report.points(arms)
  return {
    "meta": {"command": "python -m research.dose"},
    "config": {**dataclasses.asdict(dose.DoseConfig()), "recipes": ["int8_sr", "s3r"]},
    "baseline": "int8_sr",
    "excess_definition": "e² difference",
    "arms": arms,
    "missing_arms": ["int6-s1"],
    "grids": dose_report.by_grid(arms),
    "against_grid": {"reference": "int8", "grids": dose_report.against_grid(arms)},
    "points": pts,
    "slope": dose_report.slope_through_origin(pts),
    "reference_points": [{"recipe": "s3r", "source": "paper (Tables I and II)", "excess": 0.27, "gap": 0.126}],
  }


def test_the_report_builds_its_tables_and_plot_from_a_summary(tmp_path):
  summary = _hand_made_summary()
  assert summary["grids"]["int8"]["s3r"]["gap_mean"] == pytest.approx(0.001)
  xs, ys = [0.01, 0.012, 0.15], [0.004, -0.002, 0.09]
  k = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
  se = (sum((y - k * x) ** 2 for x, y in zip(xs, ys)) / 2 / sum(x * x for x in xs)) ** 0.5
  assert summary["slope"]["k"] == pytest.approx(k) and summary["slope"]["se"] == pytest.approx(se)
  paths = dose_report.write(tmp_path, summary, log=lambda _: None)
  md = paths["md"].read_text()
  assert "### int8 (Q = 127)" in md and "### int6 (Q = 31)" in md and "Not finished yet: int6-s1" in md
  assert "| 0 | +0.004 | +0.0100 | 0.0300 |" in md and "| mean ± sd | +0.001 ± 0.004 | +0.0110 ± 0.001 | |" in md
  assert "| `s3r` | paper (Tables I and II) | 0.270 | +0.126 |" in md
  assert f"{k:.2f} loss per unit excess, standard error {se:.2f}" in md
  assert "| `int6` − `int8` | seed 0 | mean ± sd |" in md and "| `s3r` | +0.086 | +0.086 |" in md
  pytest.importorskip("matplotlib")
  assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_recipe_at_a_grid_is_paired_with_itself_at_int8_in_the_arm_of_the_same_seed():
  arm = lambda grid, seed, val: {"grid": grid, "seed": seed, "val": val}
  arms = [
    arm("int8", 0, {"int8_sr": 5.0, "s3r": 5.02}),
    arm("int8", 1, {"int8_sr": 5.1, "s3r": 5.11}),
    arm("e4m3", 0, {"int8_sr": 4.99, "s3r": 5.0}),
    arm("e4m3", 1, {"int8_sr": 5.13, "s3r": None}),  # unfinished curve: no pair
    arm("e5m2", 2, {"int8_sr": 5.0, "s3r": 5.0}),  # no int8 arm of seed 2: no pair
  ]
  cross = dose_report.against_grid(arms)
  assert set(cross) == {"e4m3"}
  assert cross["e4m3"]["int8_sr"]["seeds"] == [0, 1]
  assert cross["e4m3"]["int8_sr"]["diff"] == pytest.approx([-0.01, 0.03])
  assert cross["e4m3"]["int8_sr"]["diff_mean"] == pytest.approx(0.01)
  assert cross["e4m3"]["s3r"]["seeds"] == [0] and cross["e4m3"]["s3r"]["diff"] == pytest.approx([-0.02])
  assert dose_report.against_grid([a for a in arms if a["grid"] != "int8"]) == {}


def test_the_reference_points_come_from_the_paper_and_the_committed_sweep():
  points = {p["recipe"]: p for p in dose_report.reference_points(ROOT / "research" / "results")}
  assert all("3200-step" not in p["source"] for p in points.values())
  assert points["s3r"]["excess"] == pytest.approx(0.270, abs=1e-3) and points["s3r"]["gap"] == pytest.approx(0.126)
  assert points["s3r_ec_bcast"]["excess"] == pytest.approx(0.096, abs=1e-3)
  assert points["s3r_bcast"]["excess"] == pytest.approx(0.584, abs=1e-3) and points["s3r_bcast"][
    "gap"
  ] == pytest.approx(0.313, abs=1e-3)
  assert points["s3r_ec_dx_bcast"]["excess"] == pytest.approx(0.148, abs=1e-3)
  assert points["s3r_ec_dx_bcast"]["gap"] == pytest.approx(0.070, abs=1e-3)


def _long_run(tmp_path, recipe, seed, val, errors=None, status="done"):
  run = {"recipe": recipe, "seed": seed, "status": status, "val_losses": {"val": val} if status == "done" else {}}
  if errors is not None:
    run["dose"] = {"errors": {r: {"dw_first": e} for r, e in errors.items()}}
  folder = tmp_path / "dose_long" / "runs"
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{recipe}-lr0.004-s{seed}.json").write_text(json.dumps(run))


def test_long_arm_points_pair_each_recipe_with_the_baseline_run_of_its_seed(tmp_path):
  assert dose_paired.long_arm_points(tmp_path) == []
  _long_run(tmp_path, "int8_sr", 0, 5.0, {"int8_sr": 0.2, "s3r": 0.3, "s3r_ec_dx": 0.1})
  _long_run(tmp_path, "s3r", 0, 5.05)
  _long_run(tmp_path, "s3r_ec_dx", 1, 4.9)  # seed 1 has no int8_sr run yet: no point
  _long_run(tmp_path, "s3r_ec_dx", 0, 5.0, status="diverged")  # unfinished: no point
  (point,) = dose_paired.long_arm_points(tmp_path)
  assert point["recipe"] == "s3r" and point["seed"] == 0 and "seed 0" in point["source"]
  assert point["gap"] == pytest.approx(0.05) and point["excess"] == pytest.approx(0.3**2 - 0.2**2)


def test_paired_dose_reports_each_seed_and_the_sign_count_per_recipe():
  def run(recipe, seed, val, errors=None):
    return {"recipe": recipe, "seed": seed, "status": "done", "val_losses": {"val": val}} | (
      {"dose": {"errors": {r: {"dw_first": e} for r, e in errors.items()}}} if errors else {}
    )

  runs = [
    run("int8_sr", 0, 5.0, {"int8_sr": 0.2, "s3r": 0.3}),
    run("int8_sr", 1, 4.9, {"int8_sr": 0.1, "s3r": 0.2}),
    run("s3r", 0, 5.04, {"int8_sr": 0.3, "s3r": 0.4}),  # its own parameters: another excess
    run("s3r", 1, 4.88),
  ]
  rows = dose_paired.paired_dose(runs)
  assert [(r["recipe"], r["seed"]) for r in rows] == [("s3r", 0), ("s3r", 1)]
  assert rows[0]["gap"] == pytest.approx(0.04) and rows[1]["gap"] == pytest.approx(-0.02)
  assert rows[0]["excess"] == pytest.approx(0.05) and rows[0]["excess_own_params"] == pytest.approx(0.07)
  assert rows[1]["excess"] == pytest.approx(0.03) and rows[1]["excess_own_params"] is None
  md = "\n".join(dose_paired.paired_dose_markdown(rows))
  assert "| `s3r` | 0 | +0.040 | +0.0500 | +0.0700 |" in md and "| `s3r` | 1 | -0.020 | +0.0300 | – |" in md
  # t = 0.010 / (0.042 / √2) = 1/3 on 1 degree of freedom: p = 1 − 2·atan(1/3)/π = 0.795
  line = "`s3r` − `int8_sr`: +0.010 ± 0.042 over 2 seed(s), positive on 1 of 2, paired t +0.33 (p 0.795); excess"
  assert line + " +0.0400 ± 0.0141" in md
  assert dose_paired.paired_dose_markdown([]) == []


def test_the_slope_error_says_when_points_near_zero_excess_leave_the_slope_undetermined():
  point = lambda excess, gap: {"recipe": "s3r", "excess": excess, "gap": gap}
  on_a_line = [point(x, 0.6 * x + d) for x, d in ((0.1, 0.001), (0.2, -0.001), (0.4, 0.0005))]
  near_zero = [point(x, g) for x, g in ((1e-4, 0.03), (3e-4, -0.05), (2e-4, 0.01))]
  determined, undetermined, single = (
    dose_report.slope_through_origin(p) for p in (on_a_line, near_zero, [point(0.1, 0.05)])
  )
  assert determined is not None and undetermined is not None and single is not None
  assert determined["k"] == pytest.approx(0.6, abs=0.01) and determined["se"] < 0.01
  assert undetermined["se"] > abs(undetermined["k"])
  assert single["se"] is None
