"""Statistics of final losses over seeds: mean and sample sd, Welch's t, the paired t with its interval,
the equivalence test (TOST), the verdict of a pre-registered decision rule, table cells.

Runs with the same seed share the parameter initialization and the data order, so two recipes can
be compared seed by seed (`paired`) as well as as two samples (`welch`). SciPy is imported only
where a p-value is computed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def mean_sd(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (nan for one value)."""
  arr = np.asarray(values, float)
  return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else float("nan")


def welch(a: list[float], b: list[float]) -> tuple[float, float] | None:
  """Welch's t and its two-sided p for mean(a) - mean(b); None with fewer than two values on a side."""
  if len(a) < 2 or len(b) < 2:
    return None
  from scipy import stats

  t, p = stats.ttest_ind(a, b, equal_var=False)
  return float(t), float(p)


def paired(a: dict, b: dict) -> dict | None:
  """Per-seed differences a[s] - b[s] over the seeds both have: mean, sample sd and the paired t (p).

  With one common seed only the difference itself (a partial sweep still compares like with like);
  with equal differences no t. None when no seed is common.
  """
  seeds = sorted(set(a) & set(b))
  if not seeds:
    return None
  diff = np.asarray([a[s] - b[s] for s in seeds], float)
  sd = float(diff.std(ddof=1)) if len(seeds) > 1 else None
  out: dict[str, Any] = {"seeds": seeds, "mean": float(diff.mean()), "sd": sd, "t": None, "p": None}
  if sd and sd > 1e-9 * (1 + abs(out["mean"])):
    from scipy import stats

    t, p = stats.ttest_1samp(diff, 0.0)
    out.update(t=float(t), p=float(p), ci95=interval(diff, 0.95))
  return out


def interval(diffs, level: float = 0.95) -> tuple[float, float] | None:
  """The two-sided t interval of the mean of `diffs` at `level` (None with fewer than two values)."""
  diff = np.asarray(diffs, float)
  if diff.size < 2:
    return None
  from scipy import stats

  half = stats.t.ppf(0.5 + level / 2, df=diff.size - 1) * diff.std(ddof=1) / math.sqrt(diff.size)
  return float(diff.mean() - half), float(diff.mean() + half)


def tost(diffs, margin: float, alpha: float = 0.05) -> dict | None:
  """Two one-sided t-tests of `mean(diffs)` against the equivalence range (-margin, +margin).

  Equivalent at level `alpha` when both one-sided tests reject, which is the same as the
  (1 - 2 alpha) interval lying inside the range. None with fewer than two values or no spread.
  """
  diff = np.asarray(diffs, float)
  if diff.size < 2 or not diff.std(ddof=1) > 0:
    return None
  from scipy import stats

  se = diff.std(ddof=1) / math.sqrt(diff.size)
  df = diff.size - 1
  p_low = float(stats.t.sf((diff.mean() + margin) / se, df))  # H0: mean <= -margin
  p_high = float(stats.t.cdf((diff.mean() - margin) / se, df))  # H0: mean >= +margin
  p = max(p_low, p_high)
  return {
    "margin": margin,
    "ci": interval(diff, 1 - 2 * alpha),
    "level": 1 - 2 * alpha,
    "p": p,
    "equivalent": p < alpha,
  }


def verdict(diffs, margin: float | None = None) -> str:
  """Which side of the pre-registered rules a paired difference falls on (two-sided 95% interval;
  with a margin also the equivalence test at 0.05): "above 0", "below 0", "equivalent within
  ±margin", "below +margin" (no cost of the size of interest, without equivalence) or "open"."""
  ci = interval(diffs, 0.95)
  if ci is None:
    return "open"
  if ci[0] > 0:
    return "above 0"
  if ci[1] < 0:
    return "below 0"
  if margin is not None:
    eq = tost(diffs, margin)
    if eq and eq["equivalent"]:
      return f"equivalent within ±{margin:g}"
    if ci[1] < margin:
      return f"below +{margin:g}"
  return "open"


def fmt(x: float | None, digits: int = 3) -> str:
  """A number for a table cell; an en dash for a missing value."""
  return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def welch_cell(w: tuple[float, float] | None) -> str:
  return "–" if not w else f"{w[0]:+.2f} ({w[1]:.3g})"


def paired_cell(d: dict | None) -> str:
  if not d:
    return "–"
  if d["sd"] is None:
    return f"{d['mean']:+.3f} (seed {d['seeds'][0]} only)"
  return f"{d['mean']:+.3f} ± {d['sd']:.3f}" + ("" if d["t"] is None else f", t {d['t']:+.2f} ({d['p']:.3g})")


def defined(value, what: str):
  """`value` when a test or interval was computable (`interval` and `tost` give None for fewer than two
  differences); otherwise a ValueError naming `what`."""
  if value is None:
    raise ValueError(f"{what}: too few differences (or no spread) to compute it")
  return value
