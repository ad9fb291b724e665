"""The lockstep runner at a tiny size on CPU: paired curves of equal length, the summary's fields,
identical starting points, and a stop on the time budget that still leaves a valid summary, which
is not called complete unless the schedule ran to its end."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest

from research import lockstep, lockstep_report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(token_folder, tmp_path, **kw):
  base: dict[str, Any] = dict(
    data=str(token_folder),
    out=str(tmp_path / "out"),
    preset="tiny",
    steps=5,
    batch=2,
    seq=16,
    lr=3e-3,
    warmup=1,
    eval_every=2,
    eval_batches=2,
    time_budget=600.0,
  )
  return lockstep.LockstepConfig(**{**base, **kw})


@pytest.mark.slow
def test_lockstep_dry_run_gives_equal_length_paired_curves(token_folder, tmp_path):
  summary = lockstep.run(_cfg(token_folder, tmp_path), log=lambda _: None)
  assert summary["complete"] and summary["stopped_by"] == "steps" and summary["steps_done"] == 5
  assert summary["curves"]["step"] == [2, 4, 5]
  lengths = {r: len(v) for r, v in summary["curves"]["val"].items()}
  assert set(lengths) == {"int8_sr", "s3r", "s3r_ec_dx"} and set(lengths.values()) == {3}
  assert set(summary["paired"]) == {"s3r - int8_sr", "s3r - s3r_ec_dx", "s3r_ec_dx - int8_sr"}
  for name, d in summary["paired"].items():
    a, b = name.split(" - ")
    assert d["final"] == pytest.approx(summary["curves"]["val"][a][-1] - summary["curves"]["val"][b][-1])
    assert len(d["curve"]) == 3 and d["eval_se"] >= 0 and d["paper"] is not None
  for field in ("meta", "config", "param_count", "compile_s", "iteration_s_median", "one_seed"):
    assert field in summary
  on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert on_disk["paired"] == json.loads(json.dumps(summary["paired"]))
  lines = (tmp_path / "out" / "curves.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in lines] == [2, 4, 5]


@pytest.mark.slow
def test_lockstep_stops_on_time_budget_with_valid_summary(token_folder, tmp_path):
  summary = lockstep.run(_cfg(token_folder, tmp_path, recipes=("int8_sr", "s3r"), time_budget=1e-3), log=lambda _: None)
  assert summary["stopped_by"] == "time_budget" and summary["steps_done"] == 0
  assert summary["curves"]["step"] == [] and summary["paired"] == {}
  on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert on_disk["ended"] and not on_disk["complete"]  # a run that trained nothing is not complete
  assert set(on_disk["compile_s_by_recipe"]) == {"int8_sr", "s3r"} and on_disk["compile_s_by_recipe"]["s3r"] > 0
  assert "INCOMPLETE" in (tmp_path / "out" / "summary.md").read_text()


def test_a_summary_is_complete_only_when_the_schedule_ran_to_its_end(tmp_path):
  # the first H200 call: the schedule was fitted to 1 step, none ran, and the summary said complete
  first = json.loads((ROOT / "research/results/device_quality/run/summary.json").read_text())
  recipes = tuple(first["config"]["recipes"])
  summary = {k: first[k] for k in ("config", "schedule", "attention", "param_count", "data", "meta", "compile_s")}
  write = lambda step, ended, stopped_by: lockstep_report.write_summary(
    tmp_path, summary, [], recipes, step, [0.2] * step, ended=ended, stopped_by=stopped_by
  )
  stopped = write(0, True, "time_budget")
  assert stopped["ended"] and not stopped["complete"] and stopped["steps_done"] == 0
  assert "INCOMPLETE" in (tmp_path / "summary.md").read_text()
  assert not write(0, False, None)["complete"] and not write(1, False, None)["complete"]  # progress writes
  assert write(1, True, "steps")["complete"]  # the fitted schedule's one step ran
  assert "; complete: 1 steps done" in (tmp_path / "summary.md").read_text()


def test_lockstep_config_rejects_bad_fields(token_folder, tmp_path):
  with pytest.raises(ValueError, match="recipes"):
    _cfg(token_folder, tmp_path, recipes=("s3r",))
  with pytest.raises(ValueError, match="warmup"):
    _cfg(token_folder, tmp_path, warmup=9)


def test_build_tokens_writes_a_loadable_folder(tmp_path):
  docs = [f"document {i}: " + " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)) for i in range(300)]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n\n".join(docs))
  meta = lockstep.build_tokens(
    str(tmp_path / "tok"),
    data=str(corpus),
    vocab=300,
    cache_dir=str(tmp_path / "cache"),
    max_train_tokens=5000,
    log=lambda _: None,
  )
  loaded_meta, train, val = lockstep.load_tokens(str(tmp_path / "tok"))
  assert loaded_meta == meta and train.dtype == np.uint16 and len(train) == min(5000, meta["train_tokens_available"])
  assert "val" in val and len(val["val"]) == meta["n_tokens"]["val"]


def test_fitted_schedule_is_the_longest_that_fits():
  cfg = lockstep.LockstepConfig(data="d", out="o", preset="tiny", steps=2000, warmup=200, eval_every=250, margin=10.0)
  steps, warmup = lockstep.fitted_schedule(cfg, seconds_left=300.0, iteration_s=0.2, eval_round_s=2.0)
  cost = lambda n: n * 0.2 + (n // 250 + (n % 250 != 0)) * 2.0 + 10.0
  assert cost(steps) <= 300.0 < cost(int(steps / 0.97) + 1)
  assert warmup == round(200 * steps / 2000)
  assert lockstep.fitted_schedule(cfg, seconds_left=1e6, iteration_s=0.2, eval_round_s=2.0) == (2000, 200)


@pytest.mark.slow  # the device_quality dry run (tests/scripts) fits its schedule and measures the dose too
def test_lockstep_fits_its_schedule_and_measures_the_dose(token_folder, tmp_path):
  cfg = _cfg(token_folder, tmp_path, steps=6, warmup=1, fit_budget=True, time_budget=900.0, dose_keys=2)
  summary = lockstep.run(cfg, log=lambda _: None)
  sched = summary["schedule"]
  assert sched["fitted"] and 1 <= sched["steps"] <= 6 and summary["steps_done"] <= sched["steps"]
  assert set(summary["dose"]) == set(cfg.recipes)
  for errors in summary["dose"].values():
    assert set(errors) == {"dx_first", "dx_last", "dw_first", "embed"}
    assert all(0 < v < 10 for v in errors.values())
  report = (tmp_path / "out" / "summary.md").read_text()
  assert "## Dose" in report and "## Paired differences" in report and summary["attention"]["impl"] == "xla"


@pytest.mark.slow
def test_a_stopped_lockstep_run_continues_from_its_last_evaluation_to_the_same_losses(
  token_folder, tmp_path, monkeypatch
):
  whole = lockstep.run(_cfg(token_folder, tmp_path / "whole"), log=lambda _: None)
  cfg = _cfg(token_folder, tmp_path / "parts")
  real_step = lockstep._Models.step
  calls = {"n": 0}

  def stop_at_the_fourth_step(self, batch, lr):
    calls["n"] += 1
    if calls["n"] == 4:  # after the evaluation at step 2 wrote its resume point, before step 4's
      raise KeyboardInterrupt
    return real_step(self, batch, lr)

  with monkeypatch.context() as m:
    m.setattr(lockstep._Models, "step", stop_at_the_fourth_step)
    with pytest.raises(KeyboardInterrupt):
      lockstep.run(cfg, log=lambda _: None)
  out = pathlib.Path(cfg.out)
  assert json.loads((out / "resume.json").read_text())["step"] == 2
  lines = []
  parts = lockstep.run(cfg, log=lines.append)
  assert any("resumed at step 2" in x for x in lines)
  assert parts["curves"] == whole["curves"]  # bit for bit: same states, batches, keys and schedule
  assert [s["step"] for s in parts["resumed"]] == [2] and parts["meta"]["git"] == whole["meta"]["git"]
  assert not (out / "resume.json").exists() and not (out / "resume.npz").exists()


def test_a_resume_point_of_other_settings_is_refused_naming_the_field(token_folder, tmp_path):
  from research import lockstep_resume

  out = tmp_path / "out"
  out.mkdir()
  first = _cfg(token_folder, tmp_path)
  lockstep_resume.save(
    out,
    first,
    step=2,
    states={},
    loader={},
    schedule={"steps": 5, "warmup": 1},
    records=[],
    iter_times=[],
    segments=[],
  )
  same = lockstep_resume.load(out, _cfg(token_folder, tmp_path, time_budget=9.0), {})  # where and how long may differ
  assert same is not None and same["step"] == 2
  with pytest.raises(ValueError, match=r"other settings \(lr\)"):
    lockstep_resume.load(out, _cfg(token_folder, tmp_path, lr=1e-3), {})
