"""The sampled per-projection dX errors of research.gate_dose agree with the exact ones of
research.mechanism, and the ratio interval covers what it claims."""

from __future__ import annotations

import numpy as np
import pytest

from research import gate_dose, mechanism


def _layer(seed, t=64, k=32, n=48):
  rng = np.random.default_rng(seed)
  as_bf16 = lambda a: np.asarray(a, np.float32).astype("bfloat16").astype(np.float32)  # both paths see one value
  return (
    as_bf16(rng.standard_normal((1, t, k))),
    rng.standard_normal((k, n)).astype(np.float32),
    as_bf16(rng.standard_normal((1, t, n))),
  )


@pytest.mark.parametrize("recipe", ["int8_sr", "s3r"])
def test_sampled_dx_error_matches_the_exact_one(recipe):
  x, w, g = _layer(0)
  exact = mechanism.local_errors(x, w, g, tokens=64)["dx"][recipe] ** 2
  errs = gate_dose.sampled_dx_errors(x, w, g, "int8", keys=256, seed=3, dtype=np.float32)  # no bf16 dX rounding
  sq = np.asarray(errs[recipe]["sq"])
  se = sq.std(ddof=1) / np.sqrt(sq.size)
  # the mean of 256 independent squared errors lies within 5 standard errors of its expectation
  assert abs(sq.mean() - exact) < 5 * se, (sq.mean(), exact, se)


def test_ratio_interval_contains_the_ratio_and_narrows_with_more_keys():
  rng = np.random.default_rng(0)
  a, b = rng.gamma(20, 0.02, 400), rng.gamma(20, 0.01, 400)  # mean 0.4 and 0.2: ratio sqrt(2)
  r, lo, hi = gate_dose.ratio_interval(a, b)
  assert lo < np.sqrt(2) < hi and lo < r < hi
  r16, lo16, hi16 = gate_dose.ratio_interval(a[:16], b[:16])
  assert hi16 - lo16 > 3 * (hi - lo)


def test_s3r_ec_dx_is_below_independent_sr_on_an_unstructured_layer_at_every_grid():
  x, w, g = _layer(1)
  for grid in gate_dose.GRIDS:
    errs = gate_dose.sampled_dx_errors(x, w, g, grid, keys=16, seed=0)
    r, lo, hi = gate_dose.ratio_interval(errs["s3r_ec_dx"]["sq"], errs["int8_sr"]["sq"])
    assert hi < 1.0, (grid, r, lo, hi)
