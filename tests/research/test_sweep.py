"""The sweep protocol: learning-rate selection on seed 0, downward extension, resumption, tables."""

import json
import math
from typing import Any

import pytest
from scipy import stats as scipy_stats

from labtools.paper import PAPER_LOSS
from research import protocol, runs, stats, sweep, table1
from tests.research.conftest import tiny_sweep_config


def _cfg(tmp_path, **kw):
  base: dict[str, Any] = dict(
    name="t",
    recipes=("bf16", "int8_sr", "s3r_bcast"),
    lrs=(1e-3, 2e-3, 4e-3),
    seeds=3,
    runs_dir=str(tmp_path / "runs"),
    results_dir=str(tmp_path / "results"),
  )
  return protocol.SweepConfig(**{**base, **kw})


def _summary(recipe, lr, seed, val, status="done"):
  return {
    "run": f"{recipe}-lr{lr:.3g}-s{seed}",
    "recipe": recipe,
    "lr": lr,
    "seed": seed,
    "status": status,
    "wall_s": 60.0,
    "steps": 10,
    "val_losses": {"val": val, "c4": val + 1} if status == "done" else {},
    "median_step_s": 0.1,
    "param_count": 1000,
    "curve": [[1, 9.0], [5, 8.0], [10, 7.0]],
    "val_curve": [[10, val]],
    "train_config": {"preset": "tiny", "steps": 10, "batch": 2, "seq": 8},
  }


def _add(summaries, *items):
  for s in items:
    summaries[s["run"]] = s


def test_seed_zero_learning_rates_run_first_then_the_other_seeds_at_the_best_rate(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16",))
  assert protocol.next_runs(cfg, {}) == [("bf16", 1e-3, 0), ("bf16", 2e-3, 0), ("bf16", 4e-3, 0)]
  s = {}
  _add(s, _summary("bf16", 1e-3, 0, 5.0), _summary("bf16", 2e-3, 0, 4.0), _summary("bf16", 4e-3, 0, 4.5))
  assert protocol.best_lr(cfg, "bf16", s) == (2e-3, [])
  assert protocol.next_runs(cfg, s) == [("bf16", 2e-3, 1), ("bf16", 2e-3, 2)]
  _add(s, _summary("bf16", 2e-3, 1, 4.1), _summary("bf16", 2e-3, 2, 4.2))
  assert protocol.next_runs(cfg, s) == []


def test_a_recipe_gets_its_other_seeds_before_the_next_recipe_starts(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "s3r"))
  s = {}
  _add(s, _summary("bf16", 1e-3, 0, 5.0), _summary("bf16", 2e-3, 0, 4.0), _summary("bf16", 4e-3, 0, 4.5))
  assert protocol.next_runs(cfg, s) == [
    ("bf16", 2e-3, 1),
    ("bf16", 2e-3, 2),
    ("s3r", 1e-3, 0),
    ("s3r", 2e-3, 0),
    ("s3r", 4e-3, 0),
  ]


def test_best_rate_at_the_bottom_of_the_grid_extends_the_grid_downward(tmp_path):
  cfg = _cfg(tmp_path, recipes=("s3r_bcast",))
  s = {}
  _add(s, _summary("s3r_bcast", 1e-3, 0, 6.0), _summary("s3r_bcast", 2e-3, 0, 6.5), _summary("s3r_bcast", 4e-3, 0, 7.0))
  assert protocol.next_runs(cfg, s) == [("s3r_bcast", 5e-4, 0)]
  _add(s, _summary("s3r_bcast", 5e-4, 0, 5.5))
  assert protocol.next_runs(cfg, s) == [("s3r_bcast", 2.5e-4, 0)]
  _add(s, _summary("s3r_bcast", 2.5e-4, 0, 5.8))  # worse: 5e-4 is the best and no longer the lowest
  assert protocol.best_lr(cfg, "s3r_bcast", s) == (5e-4, [])


def test_best_rate_at_the_top_of_the_grid_extends_the_grid_upward(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16",))
  s = {}
  _add(s, _summary("bf16", 1e-3, 0, 6.0), _summary("bf16", 2e-3, 0, 5.9), _summary("bf16", 4e-3, 0, 5.8))
  assert protocol.next_runs(cfg, s) == [("bf16", 8e-3, 0)]
  _add(s, _summary("bf16", 8e-3, 0, 6.1))
  assert protocol.best_lr(cfg, "bf16", s) == (4e-3, [])


def test_diverged_runs_lose_the_learning_rate_selection(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16",))
  s = {}
  _add(
    s,
    _summary("bf16", 1e-3, 0, 5.0),
    _summary("bf16", 2e-3, 0, 4.0),
    _summary("bf16", 4e-3, 0, math.nan, status="diverged"),
  )
  assert protocol.best_lr(cfg, "bf16", s) == (2e-3, [])


def test_table_reports_mean_std_gap_and_welch_t(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_sr"), lrs=(1e-3,), seeds=3)
  s = {}
  _add(s, *[_summary("bf16", 1e-3, i, v) for i, v in enumerate([4.0, 4.1, 4.2])])
  _add(s, *[_summary("int8_sr", 1e-3, i, v) for i, v in enumerate([4.5, 4.6, 4.7])])
  rows = table1.write_tables(cfg, s)
  assert rows["bf16"]["val_mean"] == pytest.approx(4.1) and rows["bf16"]["val_std"] == pytest.approx(0.1)
  assert rows["int8_sr"]["gap_to_bf16"] == pytest.approx(0.5)
  t, p = rows["int8_sr"]["welch_vs_bf16"]
  assert t == pytest.approx(0.5 / (0.1 * (2 / 3) ** 0.5)) and p < 0.01
  doc = json.loads((tmp_path / "results" / "t.json").read_text())
  assert doc["cost"]["runs"] == 6 and doc["meta"]["git"] is not None
  md = (tmp_path / "results" / "t.md").read_text()
  assert md.count("| `int8_sr` |") == 2  # Table I and the lr table
  assert "| gap to bf16 | t vs bf16 (p) | t vs int8_sr (p) | paired vs bf16 |" in md
  assert (tmp_path / "results" / "t.png").stat().st_size > 0


def test_fixed_rates_skip_the_grid_and_run_every_seed_at_the_given_rate(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_sr"), fixed_lrs={"int8_sr": 3e-3}, seeds=2)
  assert protocol.next_runs(cfg, {}) == [
    ("bf16", 1e-3, 0),
    ("bf16", 2e-3, 0),
    ("bf16", 4e-3, 0),
    ("int8_sr", 3e-3, 0),
    ("int8_sr", 3e-3, 1),
  ]
  s = {}
  # grid runs of the fixed recipe (e.g. left from another config) are ignored: 2e-3 would win
  _add(s, _summary("int8_sr", 2e-3, 0, 3.0), _summary("int8_sr", 3e-3, 0, 4.0), _summary("int8_sr", 3e-3, 1, 4.2))
  row = table1.build_table(cfg, s)["int8_sr"]
  assert row["best_lr"] == 3e-3 and row["val"] == [4.0, 4.2]
  assert "every seed at it: int8_sr=0.003" in table1._rate_note(cfg)


def test_fixed_rate_recipes_run_seed_by_seed_so_a_partial_sweep_compares_equal_seeds(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_rtne", "int8_sr"), fixed_lrs={"bf16": 4e-3, "int8_sr": 2e-3}, seeds=3)
  s = {}
  _add(s, _summary("bf16", 4e-3, 0, 4.0))
  runs = protocol.next_runs(cfg, s)
  assert runs[:3] == [("int8_rtne", 1e-3, 0), ("int8_rtne", 2e-3, 0), ("int8_rtne", 4e-3, 0)]  # the grid first
  assert runs[3:] == [
    ("int8_sr", 2e-3, 0),
    ("bf16", 4e-3, 1),
    ("int8_sr", 2e-3, 1),
    ("bf16", 4e-3, 2),
    ("int8_sr", 2e-3, 2),
  ]


def _args(**kw):
  import argparse

  fields = [
    "config",
    "name",
    "recipes",
    "lrs",
    "fixed_lrs",
    "seeds",
    "steps",
    "warmup",
    "batch",
    "seq",
    "eval_every",
    "eval_batches",
    "preset",
    "data",
    "runs_dir",
    "results_dir",
  ]
  return argparse.Namespace(**{f: kw.get(f) for f in fields})


def test_every_committed_sweep_config_parses(tmp_path):
  import pathlib

  configs = sorted(pathlib.Path(__file__).resolve().parents[2].joinpath("research", "configs").glob("*.json"))
  sweeps = [p for p in configs if "grids" not in json.loads(p.read_text())]  # the others: research.dose
  assert sweeps
  for path in sweeps:
    cfg = sweep.config_from_args(_args(config=str(path)))
    assert cfg.recipes and all(isinstance(v, float) for v in (cfg.fixed_lrs or {}).values())


def test_fixed_rates_from_flags_merge_with_the_config_file(tmp_path):
  path = tmp_path / "c.json"
  path.write_text(
    json.dumps({"name": "c", "recipes": ["bf16", "s3r", "int8_sr"], "fixed_lrs": {"bf16": 0.004, "s3r": 0.002}})
  )
  cfg = sweep.config_from_args(_args(config=str(path), fixed_lrs="s3r=0.001,int8_sr=0.003"))
  assert cfg.fixed_lrs == {"bf16": 0.004, "s3r": 0.001, "int8_sr": 0.003}
  # --recipes picks a subset: the file's rates for the other recipes are dropped, not an error
  cfg = sweep.config_from_args(_args(config=str(path), recipes="bf16"))
  assert cfg.recipes == ("bf16",) and cfg.fixed_lrs == {"bf16": 0.004}


def test_fixed_rates_are_parsed_from_flags_and_checked(tmp_path):
  assert protocol.parse_fixed_lrs("bf16=0.004, s3r=2e-3") == {"bf16": 0.004, "s3r": 0.002}
  with pytest.raises(ValueError, match="recipe=rate"):
    protocol.parse_fixed_lrs("bf16:0.004")
  for bad in (
    {"s3r": 1e-3},  # not one of the sweep's recipes
    {"bf16": -1.0},
    {"bf16": math.inf},
    {"bf16": True},
    {"bf16": 0.0040001},
  ):  # would share the run name bf16-lr0.004-s0 with 0.004
    with pytest.raises(ValueError, match="SweepConfig.fixed_lrs"):
      _cfg(tmp_path, fixed_lrs=bad)
  cfg = _cfg(tmp_path, fixed_lrs={"bf16": 1})
  assert cfg.fixed_lrs == {"bf16": 1.0} and isinstance(cfg.fixed_lrs["bf16"], float)


def test_unknown_recipe_in_the_sweep_config_is_rejected(tmp_path):
  with pytest.raises(ValueError, match="SweepConfig.recipes"):
    _cfg(tmp_path, recipes=("int4",))


def test_negative_dose_keys_are_rejected(tmp_path):
  with pytest.raises(ValueError, match="SweepConfig.dose_keys"):
    _cfg(tmp_path, dose_keys=-1)


@pytest.mark.parametrize("keep_every", [0, 150])  # not positive; not a multiple of eval_every (100)
def test_keep_every_must_be_a_positive_multiple_of_the_checkpoint_interval(tmp_path, keep_every):
  with pytest.raises(ValueError, match="SweepConfig.keep_every"):
    _cfg(tmp_path, keep_every=keep_every, eval_every=100)


def test_keep_every_reaches_the_train_command_only_when_set(tmp_path):
  command = lambda cfg: sweep._train_command(cfg, "s3r", 2e-3, 0, tmp_path / "run")
  assert "--keep-every" not in command(_cfg(tmp_path))
  cmd = command(_cfg(tmp_path, keep_every=200, eval_every=100))
  assert cmd[cmd.index("--keep-every") + 1] == "200"


@pytest.mark.slow
def test_one_real_run_writes_its_summary_dose_and_machine_and_is_then_skipped(tmp_path, tiny_corpus):
  cfg = tiny_sweep_config(
    tmp_path, tiny_corpus, recipes=("s3r_ec_dx", "int8_sr"), fixed_lrs={"s3r_ec_dx": 2e-3, "int8_sr": 2e-3}, dose_keys=2
  )
  sweep.sweep(cfg, max_runs=1, log=lambda m: None)
  summaries = runs.load_summaries(cfg)
  (only,) = summaries.values()
  assert only["status"] == "done" and only["steps"] == 4 and math.isfinite(only["val_losses"]["val"])
  assert [r for r, _, _ in protocol.next_runs(cfg, summaries)] == ["int8_sr"]
  # every recipe's gradient errors on the same final parameters, and where the run ran
  assert only["dose"]["step"] == 4 and set(only["dose"]["errors"]) == {"s3r_ec_dx", "int8_sr"}
  assert all(0 < e < 1 for errs in only["dose"]["errors"].values() for e in errs.values())
  assert only["meta"]["jax_version"] and only["meta"]["cpu_model"] and "loadavg_after" in only["meta"]
  # the diagnostic batch is the size asked for, also above the run's own batch of 2
  run_dir = tmp_path / "runs" / "t" / only["run"]
  assert runs.load_run(str(run_dir), log=lambda m: None, batch=3)["val_batch"].shape == (3, 33)
  assert runs.load_run(str(run_dir), log=lambda m: None)["val_batch"].shape == (2, 33)
  # the Quickstart recorder reads the same run directory
  from research import snapshot

  doc = snapshot.snapshot(str(tmp_path / "runs" / "t" / only["run"]), str(tmp_path / "quick.json"), wall_s=1.0)
  assert doc["steps"] == 4 and doc["final_val_losses"]["val_loss"] == only["val_losses"]["val"]
  assert (tmp_path / "quick.png").exists() and doc["meta"]["jax_version"]
  assert doc["config"]["train"]["out"] == runs.portable(only["train_config"])["out"]  # no machine path
  assert not doc["config"]["train"]["out"].startswith("/")


def test_contrasts_report_the_difference_and_welch_t_between_the_papers_pairs(tmp_path):
  cfg = _cfg(tmp_path, recipes=("int8_rtne", "int8_sr", "s3r"), lrs=(1e-3,), seeds=3)
  s = {}
  _add(s, *[_summary("int8_rtne", 1e-3, i, v) for i, v in enumerate([4.3, 4.4, 4.5])])
  _add(s, *[_summary("int8_sr", 1e-3, i, v) for i, v in enumerate([4.0, 4.1, 4.2])])
  _add(s, *[_summary("s3r", 1e-3, i, v) for i, v in enumerate([4.0, 4.1, 4.2])])
  table1.write_tables(cfg, s)
  doc = json.loads((tmp_path / "results" / "t.json").read_text())
  (c,) = doc["contrasts"]  # only int8_rtne - int8_sr has both recipes in this sweep
  assert (c["a"], c["b"]) == ("int8_rtne", "int8_sr") and c["diff"] == pytest.approx(0.3)
  assert c["welch"][0] == pytest.approx(0.3 / (0.1 * (2 / 3) ** 0.5))
  assert c["paper_diff"] == pytest.approx(PAPER_LOSS["int8_rtne"] - PAPER_LOSS["int8_sr"])
  assert "`int8_rtne` - `int8_sr`" in (tmp_path / "results" / "t.md").read_text()


def test_paired_by_seed_difference_removes_the_variance_that_seeds_share(tmp_path):
  # Seeds move both recipes together (same initialization and data order); the per-seed
  # difference is 0.05 ± 0.01, which Welch's t cannot see under a seed spread of 0.3.
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_rtne", "int8_sr"), lrs=(1e-3,), seeds=3)
  s = {}
  _add(s, *[_summary("bf16", 1e-3, i, v) for i, v in enumerate([4.0, 4.3, 4.6])])
  _add(s, *[_summary("int8_rtne", 1e-3, i, v) for i, v in enumerate([4.05, 4.34, 4.66])])
  _add(s, *[_summary("int8_sr", 1e-3, i, v) for i, v in enumerate([4.0, 4.3, 4.6])])
  rows = table1.build_table(cfg, s)
  d = rows["int8_rtne"]["paired_vs_bf16"]
  assert d["seeds"] == [0, 1, 2] and d["mean"] == pytest.approx(0.05) and d["sd"] == pytest.approx(0.01)
  assert d["t"] == pytest.approx(0.05 / (0.01 / 3**0.5))
  assert d["p"] == pytest.approx(2 * scipy_stats.t.sf(d["t"], df=2)) and d["p"] < 0.05
  assert rows["int8_rtne"]["welch_vs_bf16"][1] > 0.5
  (c,) = table1.build_contrasts(rows)
  assert c["paired"]["mean"] == pytest.approx(0.05)


def test_paired_difference_uses_only_the_seeds_both_recipes_finished(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_sr"), lrs=(1e-3,), seeds=3)
  s = {}
  _add(s, *[_summary("bf16", 1e-3, i, v) for i, v in enumerate([4.0, 4.3, 4.6])])
  _add(s, _summary("int8_sr", 1e-3, 0, 4.1), _summary("int8_sr", 1e-3, 2, 4.8))
  d = table1.build_table(cfg, s)["int8_sr"]["paired_vs_bf16"]
  assert d["seeds"] == [0, 2] and d["mean"] == pytest.approx(0.15)
  _add(s, _summary("int8_sr", 1e-3, 1, math.nan, status="diverged"))
  assert table1.build_table(cfg, s)["int8_sr"]["paired_vs_bf16"]["seeds"] == [0, 2]
  del s["int8_sr-lr0.001-s2"]  # one common seed: the same-seed difference, no spread and no test
  d = table1.build_table(cfg, s)["int8_sr"]["paired_vs_bf16"]
  assert d["seeds"] == [0] and d["mean"] == pytest.approx(0.1) and d["sd"] is None and d["t"] is None
  assert stats.paired_cell(d) == "+0.100 (seed 0 only)"


def test_gap_curves_subtract_the_same_seeds_bf16_at_every_evaluation(tmp_path):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_rtne"), lrs=(1e-3,), seeds=2)
  s = {}
  for seed in range(2):
    b, r = _summary("bf16", 1e-3, seed, 5.0 + seed), _summary("int8_rtne", 1e-3, seed, 5.3 + seed)
    b["val_curve"] = [[5, 6.0 + seed], [10, 5.0 + seed]]
    r["val_curve"] = [[5, 6.1 + seed], [10, 5.3 + seed]]  # identical gaps: paired sd 0, t undefined
    _add(s, b, r)
  _add(s, _summary("int8_rtne", 1e-3, 2, 9.9))  # no bf16 seed 2 to pair with (and beyond cfg.seeds)
  rows = table1.write_tables(cfg, s)
  g = table1.gap_curves(cfg, s, rows)
  assert list(g) == ["int8_rtne"] and g["int8_rtne"]["steps"] == [5, 10]
  assert g["int8_rtne"]["by_seed"][0] == pytest.approx([0.1, 0.3])
  assert g["int8_rtne"]["by_seed"][1] == pytest.approx([0.1, 0.3])
  assert (tmp_path / "results" / "t_gap.png").stat().st_size > 0
  doc = json.loads((tmp_path / "results" / "t.json").read_text())
  assert doc["gap_curves"]["int8_rtne"]["by_seed"]["1"] == pytest.approx([0.1, 0.3])
  assert doc["rows"]["int8_rtne"]["paired_vs_bf16"]["t"] is None
  assert "+0.300 ± 0.000 |" in (tmp_path / "results" / "t.md").read_text()


def test_only_runs_the_named_runs_and_says_which_cannot_run_now(tmp_path, monkeypatch):
  cfg = _cfg(tmp_path, recipes=("bf16", "int8_sr"), fixed_lrs={"bf16": 4e-3, "int8_sr": 2e-3}, seeds=2)
  ran, lines = [], []

  def fake_run_one(cfg, recipe, lr, seed, log=print):
    ran.append(cfg.run_name(recipe, lr, seed))
    s = _summary(recipe, lr, seed, 4.0)
    cfg.summary_dir.mkdir(parents=True, exist_ok=True)
    (cfg.summary_dir / f"{s['run']}.json").write_text(json.dumps(s))
    return s

  monkeypatch.setattr(sweep, "run_one", fake_run_one)
  only = frozenset({"int8_sr-lr0.002-s1", "bf16-lr0.004-s7"})
  sweep.sweep(cfg, only=only, log=lines.append)
  assert ran == ["int8_sr-lr0.002-s1"]  # not bf16-s0, which the full sweep would run first
  assert any("not runnable now" in line and "bf16-lr0.004-s7" in line for line in lines)
  sweep.sweep(cfg, only=only, log=lines.append)  # finished: skipped
  assert ran == ["int8_sr-lr0.002-s1"]


def test_a_sweep_with_dose_measurements_reports_them_paired_by_seed(tmp_path):
  cfg = _cfg(tmp_path, recipes=("int8_sr", "s3r"), fixed_lrs={"int8_sr": 4e-3, "s3r": 4e-3}, seeds=1)
  base = _summary("int8_sr", 4e-3, 0, 5.0) | {
    "dose": {"errors": {"int8_sr": {"dw_first": 0.2}, "s3r": {"dw_first": 0.3}}}
  }
  s = {}
  _add(s, base, _summary("s3r", 4e-3, 0, 5.03))
  table1.write_tables(cfg, s)
  doc = json.loads((tmp_path / "results" / "t.json").read_text())
  (row,) = doc["paired_dose"]
  assert row["gap"] == pytest.approx(0.03) and row["excess"] == pytest.approx(0.05)
  md = (tmp_path / "results" / "t.md").read_text()
  assert "| `s3r` | 0 | +0.030 | +0.0500 | – |" in md and "positive on 1 of 1" in md
  # No bf16 in the sweep: the table has no columns against it.
  assert "| recipe | lr | seeds | val loss | C4 loss | t vs int8_sr (p) | paper gap |" in md and "bf16 (p)" not in md
  # No bf16 in the sweep: the gap curves subtract int8_sr's curve of the same seed.
  assert doc["gap_reference"] == "int8_sr" and doc["gap_curves"]["s3r"]["by_seed"]["0"] == pytest.approx([0.03])
  assert (tmp_path / "results" / "t_gap.png").stat().st_size > 0
  # Without dose measurements (the Table I sweeps) the report has no such section.
  table1.write_tables(_cfg(tmp_path, name="u"), {})
  assert "Paired by seed" not in (tmp_path / "results" / "u.md").read_text()


def test_the_papers_contrasts_are_differences_of_its_losses_as_its_text_quotes_them():
  """The paper's Table I gaps are rounded from unrounded means; its text quotes the dX-only vs two-way
  per-example contrast as 0.092 (5.094 - 5.002), which the gaps (0.202 - 0.109) would put at 0.093."""
  from labtools.paper import PAPER_GAP, paper_diff

  assert paper_diff("s3r_ec_dx_bcast", "s3r_ec_bcast") == pytest.approx(0.092)
  assert paper_diff("int8_rtne", "int8_sr") == pytest.approx(0.177) and paper_diff("s3r", "nope") is None
  diffs = {r: paper_diff(r, "bf16") for r in PAPER_GAP}
  assert all(d is not None and abs(d - PAPER_GAP[r]) <= 0.001 + 1e-9 for r, d in diffs.items())


def test_curve_plot_stacks_seeds_by_step_when_a_resumed_run_repeats_step_zero(tmp_path, monkeypatch):
  """A run that resumed records step 0 twice; the plotted mean over seeds must pair each seed's value at
  the same step (stacking by position would shift that run by one evaluation)."""
  import matplotlib.axes

  cfg = _cfg(tmp_path, recipes=("int8_sr",), fixed_lrs={"int8_sr": 4e-3}, seeds=2, steps=20)
  plain = _summary("int8_sr", 4e-3, 0, 5.0)
  plain["val_curve"] = [[0, 9.0], [10, 6.0], [20, 5.0]]
  resumed = _summary("int8_sr", 4e-3, 1, 5.2)
  resumed["val_curve"] = [[0, 9.0], [0, 9.0], [10, 6.4], [20, 5.2]]
  resumed["curve"] = [[1, 9.0], [1, 9.0], [5, 8.2], [10, 7.2]]
  s = {}
  _add(s, plain, resumed)
  plotted = {}
  errorbar = matplotlib.axes.Axes.errorbar

  def record(self, x, y, *args, **kw):
    plotted["steps"], plotted["mean"] = list(x), list(y)
    return errorbar(self, x, y, *args, **kw)

  monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", record)
  table1.plot_curves(cfg, s, table1.build_table(cfg, s), tmp_path / "curves.png")
  assert plotted["steps"] == pytest.approx([0, 10, 20])
  assert plotted["mean"] == pytest.approx([9.0, 6.2, 5.1])
  steps, values = table1.stack_by_step([plain["curve"], resumed["curve"]])
  assert steps.tolist() == [1, 5, 10] and values[:, -1].tolist() == [7.0, 7.2]


def test_committed_long_arm_curves_stacked_by_step_end_at_each_runs_final_loss():
  """research/results/dose_long.png's validation panel: every seed's stacked curve ends at step 3200 with that
  run's final validation loss (one of the committed runs recorded step 0 twice)."""
  import pathlib

  folder = pathlib.Path(__file__).parents[2] / "research" / "results" / "dose_long" / "runs"
  summaries = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
  for recipe in sorted({s["recipe"] for s in summaries}):
    done = [s for s in summaries if s["recipe"] == recipe and s["status"] == "done"]
    steps, values = table1.stack_by_step([s["val_curve"] for s in done])
    assert steps[-1] == done[0]["steps"], recipe
    assert values[:, -1].tolist() == pytest.approx([s["val_losses"]["val"] for s in done]), recipe
