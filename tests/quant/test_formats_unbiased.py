"""Every stochastic recipe stays an unbiased estimate of the executed forward graph's gradient at
every gradient format (int6, int4, nvfp4, mxfp4, e4m3, e5m2, mxfp8, e4m3_b128: every registered one beyond int8), as
tests/quant/test_unbiased.py checks for int8.

Per element of dX and dW: |mean over n keys - exact| <= t · sd/sqrt(n) + bias bound + f32 slack,
t the Bonferroni-corrected Student-t quantile (family-wise false-alarm rate 1e-3). The bias bound
is the 7-bit threshold bias of each code, (hi - lo)/256 in units of Δ (1/256 on a uniform grid,
(hi - lo) · s_blk/256 on the block-scaled grids, (hi - lo)/256 on FP8), summed through the product;
after S3R-EC's projection 4x the largest per-code bias.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import s3r
from s3r.quant.formats import FORMATS as REGISTRY
from tests.quant import format_reference
from tests.quant.reference import gradient_problem, gradient_samples, grads

# T = 32, N = 40: the 32 x 32 blocks (mxfp4, mxfp8) and 16 x 16 ones (nvfp4) end partial along N;
# e4m3_b128 has one partial 128 x 128 block
B, S, K, N = 2, 16, 24, 40
DRAWS = 512
FAMILY_ALPHA = 1e-3
FORMATS = [n for n in REGISTRY if n != "int8"]
STOCHASTIC = [n for n, r in s3r.RECIPES.items() if r.stochastic]
DEFAULT = ["int8_sr", "s3r", "s3r_ec", "s3r_ec_dx_bcast"]  # every threshold kind and both EC variants
CASES = [pytest.param(r, f, marks=() if r in DEFAULT else pytest.mark.slow) for f in FORMATS for r in STOCHASTIC]


def _problem(forward="int8"):
  return gradient_problem(B, S, K, N, forward)


def _samples(recipe, forward="int8"):
  return gradient_samples(recipe, _problem(forward), DRAWS)


def _bounds(recipe, fmt, dx_s, dw_s, ref):
  r = s3r.recipe(recipe)
  delta = np.float64(format_reference.step(fmt, np.float32(np.abs(ref.gp).max())))
  v = ref.gp / delta
  gap = format_reference.code_gap(fmt, v.astype(np.float32).reshape(-1, N)).reshape(v.shape)
  per_code = gap * (2.0**-23 if r.rounding == "sr" else 1 / 256)
  n_checked = dx_s[0].size + dw_s[0].size
  t = stats.t.ppf(1 - FAMILY_ALPHA / (2 * n_checked), DRAWS - 1)
  abs_wq = np.abs(ref.wq.astype(np.float64))
  abs_xq = np.abs(ref.xq.astype(np.float64))
  dx_unit = delta / ref.sx[..., None]
  dw_unit = delta / ref.sw
  dx_code = np.full_like(per_code, 4 * per_code.max()) if r.correct_dx else per_code
  dw_code = np.full_like(per_code, 4 * per_code.max()) if r.correct_dw else per_code
  dx_bias = dx_unit * (dx_code @ abs_wq.T)
  dw_bias = dw_unit * np.einsum("bsk,bsn->kn", abs_xq, dw_code)
  magnitude = np.abs(v) + gap  # a code is at most one gap away from v
  dx_slack = 1e-5 * dx_unit * (magnitude @ abs_wq.T)
  dw_slack = 1e-5 * dw_unit * np.einsum("bsk,bsn->kn", abs_xq, magnitude)
  se = lambda s: s.std(axis=0, ddof=1) / np.sqrt(DRAWS)
  return t * se(dx_s) + dx_bias + dx_slack, t * se(dw_s) + dw_bias + dw_slack


@pytest.mark.parametrize("recipe, fmt", CASES)
def test_stochastic_recipe_is_unbiased_at_every_gradient_format(recipe, fmt):
  _, _, _, ref = _problem()
  name = f"{recipe}@{fmt}"
  dx_s, dw_s = _samples(name)
  dx_bound, dw_bound = _bounds(name, fmt, dx_s, dw_s, ref)
  dx_err = np.abs(dx_s.mean(axis=0) - ref.dx)
  dw_err = np.abs(dw_s.mean(axis=0) - ref.dw)
  assert (dx_err <= dx_bound).all(), f"dX: worst excess {np.max(dx_err / dx_bound):.2f}x the bound"
  assert (dw_err <= dw_bound).all(), f"dW: worst excess {np.max(dw_err / dw_bound):.2f}x the bound"


@pytest.mark.parametrize("recipe", ["s3r_ec_dx@e5m2", "s3r@e4m3", pytest.param("s3r_ec@e5m2", marks=pytest.mark.slow)])
def test_an_all_fp8_recipe_is_unbiased_for_the_gradient_of_its_e4m3_forward(recipe):
  # E4M3 forward codes (per-token and per-channel scales onto 448): the same bounds, from the E4M3 graph
  _, _, _, ref = _problem("e4m3")
  name = f"{recipe}+fwd_e4m3"
  dx_s, dw_s = _samples(name, "e4m3")
  dx_bound, dw_bound = _bounds(name, recipe.split("@")[1], dx_s, dw_s, ref)
  dx_err = np.abs(dx_s.mean(axis=0) - ref.dx)
  dw_err = np.abs(dw_s.mean(axis=0) - ref.dw)
  assert (dx_err <= dx_bound).all(), f"dX: worst excess {np.max(dx_err / dx_bound):.2f}x the bound"
  assert (dw_err <= dw_bound).all(), f"dW: worst excess {np.max(dw_err / dw_bound):.2f}x the bound"


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_to_nearest_at_the_format_is_visibly_biased_where_sr_is_not(fmt):
  x, w, g, ref = _problem()
  rtne = (np.asarray(a, np.float64) for a in grads(f"int8_rtne@{fmt}", jnp.asarray(x), jnp.asarray(w), g, None))
  dx_rtne, dw_rtne = rtne
  dx_s, dw_s = _samples(f"s3r@{fmt}")
  dx_bound, dw_bound = _bounds(f"s3r@{fmt}", fmt, dx_s, dw_s, ref)
  assert np.mean(np.abs(dx_rtne - ref.dx) > dx_bound) > 0.1
  assert np.mean(np.abs(dw_rtne - ref.dw) > dw_bound) > 0.1
