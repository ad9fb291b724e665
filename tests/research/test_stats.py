"""The paired interval, the equivalence test and the decision rules' verdicts of research/stats.py."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from research import dose_paired, stats


def _interval(diffs, level: float = 0.95) -> tuple[float, float]:
  """stats.interval of differences that have one."""
  ci = stats.interval(diffs, level)
  assert ci is not None
  return ci


def _tost(diffs, margin: float) -> dict:
  """stats.tost of differences that have one."""
  eq = stats.tost(diffs, margin)
  assert eq is not None
  return eq


def test_the_interval_is_the_t_interval_of_the_mean():
  diffs = [0.009, 0.027, 0.018]
  lo, hi = _interval(diffs, 0.95)
  m, se = np.mean(diffs), np.std(diffs, ddof=1) / np.sqrt(3)
  assert (lo, hi) == pytest.approx(scipy_stats.t.interval(0.95, 2, loc=m, scale=se))
  assert stats.interval([0.1]) is None


def test_the_interval_covers_the_true_mean_at_its_level():
  """Over 4000 draws of 6 normal differences, the 95% interval covers the true mean 95% of the time
  (binomial sd 0.0034: the bound 0.94-0.96 is about three sd)."""
  rng = np.random.default_rng(0)
  covered = [lo < 0.02 < hi for lo, hi in (_interval(rng.normal(0.02, 0.01, 6)) for _ in range(4000))]
  assert 0.94 < np.mean(covered) < 0.96


def test_tost_declares_equivalence_exactly_when_the_90_interval_is_inside_the_margin():
  near = [0.001, -0.002, 0.003, 0.0, -0.001, 0.002]
  eq = _tost(near, 0.01)
  assert eq["equivalent"] and -0.01 < eq["ci"][0] and eq["ci"][1] < 0.01 and eq["level"] == pytest.approx(0.9)
  wide = [-0.003, -0.006, 0.007]  # the three-seed s3r_ec_dx gaps: interval too wide for ±0.01
  eq = _tost(wide, 0.01)
  assert not eq["equivalent"] and (eq["ci"][0] < -0.01 or eq["ci"][1] > 0.01)
  # the p of the larger one-sided test: mean 0 − margin over its standard error
  se = np.std(near, ddof=1) / np.sqrt(6)
  assert _tost(near, 0.01)["p"] == pytest.approx(scipy_stats.t.cdf((np.mean(near) - 0.01) / se, 5))
  assert stats.tost([0.1], 0.01) is None and stats.tost([0.1, 0.1], 0.01) is None


@pytest.mark.parametrize(
  ("diffs", "expected"),
  [
    ([0.009, 0.027, 0.018, 0.02, 0.015, 0.022], "above 0"),
    ([-0.009, -0.027, -0.018, -0.02, -0.015, -0.022], "below 0"),
    ([0.001, -0.002, 0.003, 0.0, -0.001, 0.002], "equivalent within ±0.01"),
    ([0.001, -0.004, 0.006, -0.003, 0.002, 0.004], "equivalent within ±0.01"),
    ([-0.003, -0.006, 0.007], "open"),
  ],
)
def test_the_verdict_follows_the_decision_rules(diffs, expected):
  assert stats.verdict(diffs, 0.01) == expected


def test_below_the_margin_without_equivalence_is_its_own_verdict():
  diffs = [-0.02, 0.004, -0.03, 0.002, -0.01, 0.003]  # 95% interval below +0.01, lower end far below −0.01
  assert _interval(diffs)[1] < 0.01 and not _tost(diffs, 0.01)["equivalent"]
  assert stats.verdict(diffs, 0.01) == "below +0.01"
  assert stats.verdict(diffs) == "open"  # without a margin only the sign rules apply


def test_paired_tests_cover_each_recipe_and_each_pair_on_common_seeds():
  rows = [{"recipe": "s3r", "seed": s, "gap": g} for s, g in enumerate([0.009, 0.027, 0.018])] + [
    {"recipe": "s3r_ec_dx", "seed": s, "gap": g} for s, g in enumerate([-0.003, -0.006])
  ]
  tests = dose_paired.paired_tests(rows, margin=0.01)
  assert set(tests) == {"s3r − int8_sr", "s3r_ec_dx − int8_sr", "s3r − s3r_ec_dx"}
  pair = tests["s3r − s3r_ec_dx"]
  assert pair["seeds"] == [0, 1] and pair["mean"] == pytest.approx(np.mean([0.012, 0.033]))
  assert tests["s3r − int8_sr"]["ci95"] == pytest.approx(stats.interval([0.009, 0.027, 0.018]))
  assert tests["s3r − int8_sr"]["verdict"] == stats.verdict([0.009, 0.027, 0.018], 0.01) == "open"
  assert tests["s3r − s3r_ec_dx"]["tost"] == stats.tost([0.012, 0.033], 0.01)
  md = "\n".join(dose_paired.paired_dose_markdown(
    [r | {"excess": 0.01, "excess_own_params": None} for r in rows], margin=0.01
  ))  # fmt: skip
  assert "95% interval [" in md and "equivalence within ±0.01 (TOST)" in md and "rule: open" in md
  plain = [r | {"excess": 0.01, "excess_own_params": None} for r in rows]
  assert "TOST" not in "\n".join(dose_paired.paired_dose_markdown(plain))  # no margin: the earlier report
