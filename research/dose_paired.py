"""Seeds paired within a run: each recipe's gap in final validation loss to the baseline (`int8_sr`) at the same
seed, with its measured *excess* (the extra e² of block 0's relative dW error), the paired tests over seeds and their
report lines; and the 3200-step INT8 arm's points (`research sweep` run files) for the dose plot."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from labtools import results as provenance
from research import stats

BASELINE = "int8_sr"
METRIC = "dw_first"  # the relative dW error of block 0 (research.gradients.METRICS)


def mean_sd(values: list) -> tuple[float | None, float | None]:
  """Mean and sample sd of the finite values (sd None below two)."""
  xs = [v for v in values if v is not None and math.isfinite(v)]
  if not xs:
    return None, None
  return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else None


def fmt(x: float | None, spec: str = "+.3f") -> str:
  """`x` in `spec`, or a dash for a missing value."""
  return "–" if x is None else format(x, spec)


LONG_ARM = "dose_long"  # research/results/dose_long/runs/<run>.json: the 3200-step INT8 arm (`research sweep`)


def _excess(run: dict, recipe: str, baseline: str) -> float | None:
  """e²(recipe) − e²(baseline) of the errors `run` measured on its own final parameters (its `dose`)."""
  errors = (run.get("dose") or {}).get("errors") or {}
  if recipe not in errors or baseline not in errors:
    return None
  return errors[recipe][METRIC] ** 2 - errors[baseline][METRIC] ** 2


def paired_dose(runs: list[dict], baseline: str = BASELINE) -> list[dict]:
  """Every finished run of a sweep with `dose` measurements, other than the baseline's, paired with the
  finished baseline run of its seed (same initialization and data order): the gap in final validation
  loss, the excess measured on the baseline run's final parameters (as in the lockstep arms) and, where
  the run measured one, on its own final parameters. Runs without such a partner give no row."""
  done = {(r["recipe"], r["seed"]): r for r in runs if r.get("status") == "done" and "val" in r.get("val_losses", {})}
  out = []
  for (recipe, seed), run in sorted(done.items()):
    base = done.get((baseline, seed))
    if recipe == baseline or base is None:
      continue
    excess = _excess(base, recipe, baseline)
    if excess is None:
      continue
    out.append({
      "recipe": recipe,
      "seed": seed,
      "gap": run["val_losses"]["val"] - base["val_losses"]["val"],
      "excess": excess,
      "excess_own_params": _excess(run, recipe, baseline),
    })  # fmt: skip
  return out


def paired_tests(rows: list[dict], baseline: str = BASELINE, margin: float | None = None) -> dict:
  """Per recipe, and per pair of recipes, the paired gaps over the seeds they share: mean ± sd, the
  paired t-test against 0 with its 95% interval, the equivalence test within ±`margin` (when given)
  and the verdict of the decision rules (`stats.verdict`). Keys "recipe − baseline" and "a − b"."""
  gaps = {}
  for r in rows:
    gaps.setdefault(r["recipe"], {})[r["seed"]] = r["gap"]
  pairs = [(r, baseline, g) for r, g in gaps.items()]
  names = list(gaps)
  for i, a in enumerate(names):  # a − b = (a − baseline) − (b − baseline), seed by seed
    for b in names[i + 1 :]:
      common = sorted(set(gaps[a]) & set(gaps[b]))
      pairs.append((a, b, {s: gaps[a][s] - gaps[b][s] for s in common}))
  out = {}
  for a, b, by_seed in pairs:
    diffs = [by_seed[s] for s in sorted(by_seed)]
    test = stats.paired(by_seed, dict.fromkeys(by_seed, 0.0)) or {}
    out[f"{a} − {b}"] = {
      "seeds": sorted(by_seed),
      "mean": test.get("mean"),
      "sd": test.get("sd"),
      "positive": sum(x > 0 for x in diffs),
      "t": test.get("t"),
      "p": test.get("p"),
      "ci95": test.get("ci95"),
      "tost": None if margin is None else stats.tost(diffs, margin),
      "verdict": stats.verdict(diffs, margin),
    }
  return out


def _test_line(name: str, d: dict) -> str:
  n = len(d["seeds"])
  line = f"- `{name.replace(' − ', '` − `')}`: {fmt(d['mean'])} ± {fmt(d['sd'], '.3f')} over {n} seed(s), "
  line += f"positive on {d['positive']} of {n}"
  if d["t"] is not None:
    lo, hi = d["ci95"]
    line += f", paired t {d['t']:+.2f} (p {d['p']:.3g}), 95% interval [{lo:+.3f}, {hi:+.3f}]"
  if d["tost"]:
    eq = d["tost"]
    lo, hi = eq["ci"]
    line += (
      f"; equivalence within ±{eq['margin']:g} (TOST): {eq['level']:.0%} interval [{lo:+.3f}, {hi:+.3f}], "
      f"p {eq['p']:.3g}"
    )
  return line + f"; rule: {d['verdict']}"


def paired_dose_markdown(rows: list[dict], baseline: str = BASELINE, margin: float | None = None) -> list[str]:
  """The paired rows as a table, then per recipe the mean ± sd over seeds, how many gaps are positive and
  the paired t-test of the gaps against 0 (two or more seeds); with a margin, the tests of
  `paired_tests` for every recipe and pair of recipes."""
  if not rows:
    return []
  cells = [
    [f"`{r['recipe']}`", r["seed"], fmt(r["gap"]), fmt(r["excess"], "+.4f"), fmt(r["excess_own_params"], "+.4f")]
    for r in rows
  ]
  lines = [
    f"\nPaired by seed against `{baseline}` (same initialization and data order): gap in final validation "
    f"loss, and the excess e²(recipe) − e²({baseline}) of the {METRIC} relative error measured on the "
    f"`{baseline}` run's final parameters and on the recipe run's own:\n",
    *provenance.markdown_table(["recipe", "seed", "gap", "excess", "excess, own parameters"], cells).splitlines(),
    "",
  ]
  for recipe in dict.fromkeys(r["recipe"] for r in rows):
    gaps = [r["gap"] for r in rows if r["recipe"] == recipe]
    excess = [r["excess"] for r in rows if r["recipe"] == recipe]
    (g, g_sd), (e, e_sd) = mean_sd(gaps), mean_sd(excess)
    positive = sum(x > 0 for x in gaps)
    test = stats.paired(dict(enumerate(gaps)), dict.fromkeys(range(len(gaps)), 0.0))  # the gap against 0
    t_cell = "" if not test or test["t"] is None else f", paired t {test['t']:+.2f} (p {test['p']:.3g})"
    lines.append(
      f"- `{recipe}` − `{baseline}`: {fmt(g)} ± {fmt(g_sd, '.3f')} over {len(gaps)} seed(s), positive on "
      f"{positive} of {len(gaps)}{t_cell}; excess {fmt(e, '+.4f')} ± {fmt(e_sd, '.4f')}"
    )
  if margin is not None:
    lines += [
      f"\nPaired tests with the decision rules (two-sided 95% t interval; equivalence within ±{margin:g} by "
      "two one-sided tests at 0.05). Rule: 'above 0' or 'below 0' when the 95% interval excludes 0; "
      f"'equivalent within ±{margin:g}' when the 90% interval lies inside the margin; 'below +{margin:g}' "
      "when the 95% interval lies below the margin without equivalence; otherwise 'open':\n",
      *(_test_line(name, d) for name, d in paired_tests(rows, baseline, margin).items()),
    ]
  return lines


def long_arm_points(results_root: pathlib.Path = provenance.REPO_ROOT / "research" / "results") -> list[dict]:
  """(excess, gap to int8_sr) of the 3200-step INT8 arm, per seed whose `int8_sr` run and recipe run
  are both finished (`paired_dose` of its committed run summaries). No runs, no points."""
  runs_dir = results_root / LONG_ARM / "runs"
  runs = [json.loads(f.read_text()) for f in sorted(runs_dir.glob("*.json"))] if runs_dir.is_dir() else []
  return [
    {
      "recipe": r["recipe"],
      "source": f"3200-step INT8 arm (results/{LONG_ARM}), seed {r['seed']}",
      "seed": r["seed"],
      "excess": r["excess"],
      "gap": r["gap"],
    }
    for r in paired_dose(runs)
  ]
