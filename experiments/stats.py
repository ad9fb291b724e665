"""Statistics of final losses over seeds: mean and sample sd, Welch's t, the paired t, table cells.

Runs with the same seed share the parameter initialization and the data order, so two recipes can
be compared seed by seed (`paired`) as well as as two samples (`welch`). SciPy is imported only
where a p-value is computed.
"""

from __future__ import annotations

import math

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
  out = {"seeds": seeds, "mean": float(diff.mean()), "sd": sd, "t": None, "p": None}
  if sd and sd > 1e-9 * (1 + abs(out["mean"])):
    from scipy import stats

    t, p = stats.ttest_1samp(diff, 0.0)
    out.update(t=float(t), p=float(p))
  return out


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
