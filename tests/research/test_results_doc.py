"""research/docs/results.md's sentences about the dose arms and the long INT8 arm say what their files hold.

Each phrase is rebuilt from the committed run files and reports (wall times, the equivalence test on C4 and
on the seeds run after the rules were written, the verdicts of the dose arms' predictions, which lockstep
arms resumed) and looked up in the page; each test also changes one input and checks the phrase moves.
"""

from __future__ import annotations

import json
import pathlib

from research import stats

ROOT = pathlib.Path(__file__).parents[2]
RESULTS = ROOT / "research" / "results"
LONG_ARM_RUNS = RESULTS / "dose_long" / "runs"
RULE_SEEDS = (3, 4, 5)  # run after research/results/dose_long/PREDICTIONS_six_seeds.md fixed the decision rules


def _page() -> str:
  return " ".join((ROOT / "research" / "docs" / "results.md").read_text().split())


def _signed(x: float, digits: int = 3) -> str:
  return f"{x:+.{digits}f}".replace("-", "−")


def _span(lo_hi) -> str:
  return "[{}, {}]".format(*map(_signed, lo_hi))


def _long_runs() -> list[dict]:
  return [json.loads(p.read_text()) for p in sorted(LONG_ARM_RUNS.glob("*.json"))]


def wall_phrases(runs: list[dict]) -> tuple[str, str]:
  """The long arm's per-run wall time over all runs, and over seeds 0-2 (`wall_s` of each run file)."""
  walls = [r["wall_s"] for r in runs if r["status"] == "done"]
  early = [r["wall_s"] for r in runs if r["status"] == "done" and r["seed"] < RULE_SEEDS[0]]
  lo, hi = min(walls), max(walls)
  return (
    f"each {lo / 60:.0f}-{hi / 60:.0f} minutes on a 2-core machine (`wall_s` in the run files: {lo:.0f}-{hi:.0f} s;",
    f"Wall times of seeds 0-{RULE_SEEDS[0] - 1} (`wall_s` in the run files): "
    f"{min(early):.0f}-{max(early):.0f} s per run",
  )


def test_results_doc_quotes_the_long_arm_wall_times_of_the_run_files():
  runs, page = _long_runs(), _page()
  for phrase in wall_phrases(runs):
    assert phrase in page, phrase
  runs[0]["wall_s"] = 20000.0  # the check can fail
  assert not all(phrase in page for phrase in wall_phrases(runs))


def scope_phrases(runs: list[dict], margin: float = 0.01) -> list[str]:
  """Where the long arm's equivalence of `s3r_ec_dx` to `int8_sr` stops: its 90% interval on C4 over every
  seed, and on Wikipedia over the seeds run after the rules were written (with the TOST p); the contrast
  `s3r` − `s3r_ec_dx` over every seed with its 95% interval."""
  final = {(r["recipe"], r["seed"], k): v for r in runs if r["status"] == "done" for k, v in r["val_losses"].items()}
  seeds = sorted({s for (_, s, _) in final})

  def gaps(a: str, b: str, key: str, over) -> list[float]:
    return [final[a, s, key] - final[b, s, key] for s in over]

  c4 = stats.defined(stats.tost(gaps("s3r_ec_dx", "int8_sr", "c4", seeds), margin), "TOST")
  late = stats.defined(stats.tost(gaps("s3r_ec_dx", "int8_sr", "val", RULE_SEEDS), margin), "TOST")
  assert not c4["equivalent"] and not late["equivalent"], "the page says the equivalence is not reached there"
  central = gaps("s3r", "s3r_ec_dx", "val", seeds)
  mean, sd = stats.mean_sd(central)
  return [
    f"on C4 validation the same runs give a 90% interval of {_span(c4['ci'])}, not inside the margin",
    f"seeds {RULE_SEEDS[0]}-{RULE_SEEDS[-1]} alone, the seeds run after the rules were written, give "
    f"{_span(late['ci'])} (TOST p {late['p']:.2f})",
    f"is not reached on C4 validation (90% interval {_span(c4['ci'])}) nor on seeds {RULE_SEEDS[0]}-"
    f"{RULE_SEEDS[-1]} alone ({_span(late['ci'])})",
    f"it is {mean:+.3f} ± {sd:.3f} (95% interval {_span(stats.defined(stats.interval(central), 'interval'))}, above 0)",
  ]


def test_results_doc_scope_of_the_long_arm_equivalence_matches_the_run_files():
  runs, page = _long_runs(), _page()
  for phrase in scope_phrases(runs):
    assert phrase in page, phrase
  (moved,) = [r for r in runs if r["recipe"] == "s3r_ec_dx" and r["seed"] == 4]
  moved["val_losses"]["c4"] += 0.002  # the check can fail
  assert scope_phrases(runs)[0] not in page


WINDOWS = {"s3r": (0.05, 0.2), "s3r_ec_dx": (-0.02, 0.02)}  # prediction 2 at int6 (dose/PREDICTIONS.md)


def prediction_two_cell(dose: dict) -> str:
  """Prediction 2's outcome and verdict at int6: `s3r` in +0.05..+0.2 and `s3r_ec_dx` in 0 ± 0.02, seed by seed."""
  grid = dose["grids"]["int6"]
  outcome = "; ".join(", ".join(_signed(g) for g in grid[r]["gap"]) for r in WINDOWS)
  misses = []
  for i, seed in enumerate(grid["s3r"]["seeds"]):
    for recipe, (lo, hi) in WINDOWS.items():
      gap = grid[recipe]["gap"][i]
      if not lo <= gap <= hi:
        side, by = ("below", lo - gap) if gap < lo else ("above", gap - hi)
        misses.append((seed, f"`{recipe}` {_signed(gap)}, {by:.3f} {side} the window"))
  held = [s for s in grid["s3r"]["seeds"] if s not in {m[0] for m in misses}]
  verdict = "; ".join(f"misses on seed {s} ({what})" for s, what in misses) or "holds on every seed"
  if misses and held:
    verdict += "; holds on seed " + ", ".join(map(str, held))
  return f"| {outcome} | {verdict} |"


def decision_rule_cell(dose: dict) -> str:
  """The dose arms' decision rule: `s3r_ec_dx` − `int8_sr` per grid and seed, as the verdict table quotes it."""
  grids = dose["grids"]
  gaps = {g: ", ".join(_signed(x) for x in grids[g]["s3r_ec_dx"]["gap"]) for g in grids}
  return (
    f"| int4: `s3r_ec_dx` − `int8_sr` {gaps['int4'].replace(', ', ' and ')}; int6 {gaps['int6']}; "
    f"int8 {gaps['int8']}; NVFP4 {gaps['nvfp4']} |"
  )


def test_results_doc_dose_verdicts_follow_the_gaps_in_the_dose_report():
  dose = json.loads((RESULTS / "dose.json").read_text())
  text = (ROOT / "research" / "docs" / "results.md").read_text()
  assert prediction_two_cell(dose) in text, prediction_two_cell(dose)
  assert decision_rule_cell(dose) in text, decision_rule_cell(dose)
  dose["grids"]["int6"]["s3r_ec_dx"]["gap"][0] = -0.019  # the check can fail: inside the window, the row holds
  assert prediction_two_cell(dose) not in text and decision_rule_cell(dose) not in text


def resume_phrase(arms: dict[str, list[dict]]) -> str:
  """Which lockstep arms of the committed dose studies resumed (`resumed` in each summary.json)."""
  parts = []
  for folder, summaries in arms.items():
    resumed = [s["name"] for s in summaries if s["resumed"]]
    if resumed:
      parts.append(
        f"{len(resumed)} of the {len(summaries)} arms of `research/results/{folder}/arms/` resumed "
        f"({', '.join(resumed)})"
      )
    else:
      parts.append(f"The {len(summaries)} arms of `research/results/{folder}/arms/` ran without a stop")
  return "; ".join(parts)


def test_results_doc_says_which_lockstep_arms_resumed():
  arms = {
    folder: [
      {"name": p.parent.name, "resumed": json.loads(p.read_text()).get("resumed", [])}
      for p in sorted((RESULTS / folder / "arms").glob("*/summary.json"))
    ]
    for folder in ("dose", "dose_fp8")
  }
  assert resume_phrase(arms) in _page(), resume_phrase(arms)
  arms["dose"][0]["resumed"] = [{"step": 100}]  # the check can fail
  assert resume_phrase(arms) not in _page()


def test_quality_at_scale_page_quotes_the_long_arm_as_results_md_does():
  """research/docs/quality-at-scale.md's summary of the CPU runs: the long arm's six-seed intervals on Wikipedia
  (research/results/dose_long.json) and the C4 interval recomputed from the run files."""
  doc = json.loads((RESULTS / "dose_long.json").read_text())
  tests = {r: doc["paired_tests"][f"{r} − int8_sr"] for r in ("s3r", "s3r_ec_dx")}
  runs = _long_runs()
  final = {(r["recipe"], r["seed"]): r["val_losses"]["c4"] for r in runs if r["status"] == "done"}
  seeds = sorted({s for (_, s) in final})
  c4 = stats.defined(stats.tost([final["s3r_ec_dx", s] - final["int8_sr", s] for s in seeds], 0.01), "TOST")
  page = " ".join((ROOT / "research" / "docs" / "quality-at-scale.md").read_text().split())
  phrases = [
    f"`s3r` ends {_signed(tests['s3r']['mean'])} above independent SR (95% interval {_span(tests['s3r']['ci95'])})",
    f"on Wikipedia validation (90% interval {_span(tests['s3r_ec_dx']['tost']['ci'])})",
    f"on C4 validation that equivalence is not reached (90% interval {_span(c4['ci'])};",
  ]
  for phrase in phrases:
    assert phrase in page, phrase
  assert "six seeds" in page and len(seeds) == 6
  moved = stats.defined(stats.tost([final["s3r_ec_dx", s] - final["int8_sr", s] + 0.002 for s in seeds], 0.01), "TOST")
  assert _span(moved["ci"]) != _span(c4["ci"])  # the check can fail
