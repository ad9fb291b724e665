"""Every stochastic recipe is an unbiased estimate of the executed forward graph's gradient.

The upstream gradient is heavy-tailed (log-normal magnitudes over four decades), so most of
G' lies far below the per-tensor step Δ: round-to-nearest flushes it and is visibly biased,
while stochastic rounding keeps it in expectation. For each element we require
  |mean over n keys - exact| <= t * sd / sqrt(n) + bias bound + f32 slack
with t the Bonferroni-corrected Student-t quantile over all checked elements (family-wise
false-alarm rate 1e-3), the bias bound the known 7-bit threshold bias (≤ Δ/256 per code,
docs/algorithm.md §1; 4x that after S3R-EC's projection) and f32 slack for the float arithmetic.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import s3r
from tests.quant.reference import gradient_problem, gradient_samples, grads

B, S, K, N = 2, 16, 24, 20
DRAWS = 512
FAMILY_ALPHA = 1e-3
STOCHASTIC = [n for n, r in s3r.RECIPES.items() if r.stochastic]


def _problem():
  return gradient_problem(B, S, K, N)


@functools.cache
def _samples(recipe):
  return gradient_samples(recipe, _problem(), DRAWS)


def _bounds(recipe, dx_s, dw_s, ref):
  """Per-element allowed |mean - exact| for dX [B,S,K] and dW [K,N]."""
  r = s3r.recipe(recipe)
  n_checked = dx_s[0].size + dw_s[0].size
  t = stats.t.ppf(1 - FAMILY_ALPHA / (2 * n_checked), DRAWS - 1)
  # Per-code rounding bias: 2^-23 for f32 uniforms, 1/256 for 7-bit thresholds, 4x after EC.
  per_code = {"sr": 2.0**-23, "shared": 1 / 256}[r.rounding]
  abs_wq = np.abs(ref.wq.astype(np.float64))
  abs_xq = np.abs(ref.xq.astype(np.float64))
  dx_unit = ref.delta / ref.sx[..., None]  # dX per unit of Q Ŵᵀ
  dw_unit = ref.delta / ref.sw
  dx_bias = dx_unit * abs_wq.sum(axis=1) * per_code * (4 if r.correct_dx else 1)
  dw_bias = dw_unit * abs_xq.sum(axis=(0, 1))[:, None] * per_code * (4 if r.correct_dw else 1)
  # f32 slack: generous relative error on the magnitude of the summed terms
  v_abs = np.abs(ref.gp / ref.delta) + 1
  dx_slack = 1e-5 * dx_unit * (v_abs @ abs_wq.T)
  dw_slack = 1e-5 * dw_unit * np.einsum("bsk,bsn->kn", abs_xq, v_abs)
  se = lambda s: s.std(axis=0, ddof=1) / np.sqrt(DRAWS)
  return t * se(dx_s) + dx_bias + dx_slack, t * se(dw_s) + dw_bias + dw_slack


@pytest.mark.parametrize("recipe", STOCHASTIC)
def test_stochastic_recipe_is_unbiased_on_heavy_tailed_gradients(recipe):
  _, _, _, ref = _problem()
  dx_s, dw_s = _samples(recipe)
  dx_bound, dw_bound = _bounds(recipe, dx_s, dw_s, ref)
  dx_err = np.abs(dx_s.mean(axis=0) - ref.dx)
  dw_err = np.abs(dw_s.mean(axis=0) - ref.dw)
  assert (dx_err <= dx_bound).all(), f"dX: worst excess {np.max(dx_err / dx_bound):.2f}x the bound"
  assert (dw_err <= dw_bound).all(), f"dW: worst excess {np.max(dw_err / dw_bound):.2f}x the bound"


def test_round_to_nearest_is_visibly_biased_where_stochastic_rounding_is_not():
  x, w, g, ref = _problem()
  dx_rtne, dw_rtne = (np.asarray(a, np.float64) for a in grads("int8_rtne", jnp.asarray(x), jnp.asarray(w), g, None))
  dx_s, dw_s = _samples("int8_sr")
  dx_bound, dw_bound = _bounds("int8_sr", dx_s, dw_s, ref)
  # Most of G' lies below Δ/2 here, so RTNE drops it: the same bound that every SR recipe
  # meets is violated by a large share of RTNE's (deterministic) gradient entries.
  assert np.mean(np.abs(ref.gp) < ref.delta / 2) > 0.5
  assert np.mean(np.abs(dx_rtne - ref.dx) > dx_bound) > 0.25
  assert np.mean(np.abs(dw_rtne - ref.dw) > dw_bound) > 0.25
