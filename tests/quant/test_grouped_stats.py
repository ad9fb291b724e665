"""Statistics of grouped_qmatmul per expert: every stochastic recipe is unbiased (dX rows and each
dW[e]), S3R-EC's per-segment identities hold, and Thm. 1's direction survives the grouping.

The unbiasedness bound is the dense test's (tests/quant/test_unbiased.py): per element
  |mean over n keys - exact| <= t · sd / sqrt(n) + bias bound + f32 slack,
t the Bonferroni-corrected Student-t quantile over all checked elements (family-wise
false-alarm rate 1e-3), the bias bound the 7-bit thresholds' Δ/256 per code (4x after the
S3R-EC projection, whose row, column and segment means each carry at most that bias).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import s3r
from s3r.quant import thresholds
from s3r.quant.grouped import ec as grouped_ec
from tests.quant.reference import heavy_tailed, np_rtne_codes, np_scale

T, K, N = 40, 16, 12
SIZES = (12, 0, 15, 9)  # an empty expert and 4 padding rows
E = len(SIZES)
DRAWS = 256
FAMILY_ALPHA = 1e-3
STOCHASTIC = [n for n, r in s3r.RECIPES.items() if r.stochastic]


class GroupedReference:
  """Float64 forward operands and exact backward of the executed grouped forward graph."""

  def __init__(self, x, w, sizes, g):
    x, w, g = (np.asarray(a, np.float32) for a in (x, w, g))
    self.sizes = np.asarray(sizes)
    ends = np.cumsum(self.sizes)
    self.seg = np.searchsorted(ends, np.arange(x.shape[0]), side="right")  # E for padding rows
    self.valid = self.seg < len(sizes)
    seg_c = np.minimum(self.seg, len(sizes) - 1)
    self.sx, self.sw = np_scale(x, axis=1), np_scale(w, axis=1)  # [T], [E, N]
    self.xq, self.wq = np_rtne_codes(x, self.sx[:, None]), np_rtne_codes(w, self.sw[:, None, :])
    x_deq = self.xq.astype(np.float64) * self.sx[:, None]
    w_deq = self.wq.astype(np.float64) * self.sw[:, None, :]
    g64 = np.where(self.valid[:, None], g.astype(np.float64), 0)
    self.dx = np.einsum("tn,tkn->tk", g64, w_deq[seg_c])
    self.dw = np.stack([x_deq[self.seg == e].T @ g64[self.seg == e] for e in range(len(sizes))])
    self.gp = np.where(self.valid[:, None], self.sx[:, None].astype(np.float64) * g * self.sw[seg_c], 0)
    self.delta = np.abs(self.gp).max() / 127
    self.wq_rows = self.wq[seg_c].astype(np.float64)  # [T, K, N]: each row's expert's codes


@functools.cache
def _problem():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((T, K)).astype(np.float32)
  w = (rng.standard_normal((E, K, N)) * np.array([0.3, 1.0, 0.05, 3.0])[:, None, None]).astype(np.float32)
  g = heavy_tailed(rng, (T, N), decades=4)
  return x, w, g, GroupedReference(x, w, SIZES, g)


def _grads(recipe, x, w, g, key, sizes=SIZES):
  _, vjp = jax.vjp(lambda a, b: s3r.grouped_qmatmul(a, b, jnp.asarray(sizes, jnp.int32), key=key, recipe=recipe), x, w)
  return vjp(jnp.asarray(g, x.dtype))


@functools.cache
def _samples(recipe):
  x, w, g, _ = _problem()
  keys = jax.random.split(jax.random.key(123), DRAWS)
  dx, dw = jax.jit(jax.vmap(lambda k: _grads(recipe, jnp.asarray(x), jnp.asarray(w), g, k)))(keys)
  return np.asarray(dx, np.float64), np.asarray(dw, np.float64)


def _bounds(recipe, dx_s, dw_s, ref):
  r = s3r.recipe(recipe)
  n_checked = dx_s[0].size + dw_s[0].size
  t = stats.t.ppf(1 - FAMILY_ALPHA / (2 * n_checked), DRAWS - 1)
  per_code = {"sr": 2.0**-23, "shared": 1 / 256}[r.rounding]
  abs_wq, abs_xq = np.abs(ref.wq_rows), np.abs(ref.xq.astype(np.float64))
  dx_unit = ref.delta / ref.sx[:, None]
  dw_unit = ref.delta / ref.sw[:, None, :]
  seg_sum = lambda a: np.stack([a[ref.seg == e].sum(axis=0) for e in range(E)])
  dx_bias = dx_unit * abs_wq.sum(axis=2) * per_code * (4 if r.correct_dx else 1)
  dw_bias = dw_unit * seg_sum(abs_xq)[:, :, None] * per_code * (4 if r.correct_dw else 1)
  v_abs = np.abs(ref.gp / ref.delta) + 1
  dx_slack = 1e-5 * dx_unit * np.einsum("tn,tkn->tk", v_abs, abs_wq)
  dw_slack = 1e-5 * dw_unit * np.stack([abs_xq[ref.seg == e].T @ v_abs[ref.seg == e] for e in range(E)])
  se = lambda s: s.std(axis=0, ddof=1) / np.sqrt(DRAWS)
  return t * se(dx_s) + dx_bias + dx_slack, t * se(dw_s) + dw_bias + dw_slack


@pytest.mark.parametrize("recipe", STOCHASTIC)
def test_stochastic_recipe_is_unbiased_per_expert_on_heavy_tailed_gradients(recipe):
  _, _, _, ref = _problem()
  dx_s, dw_s = _samples(recipe)
  dx_bound, dw_bound = _bounds(recipe, dx_s, dw_s, ref)
  dx_err = np.abs(dx_s.mean(axis=0) - ref.dx)
  dw_err = np.abs(dw_s.mean(axis=0) - ref.dw)
  for e in range(E):
    rows = ref.seg == e
    assert (dx_err[rows] <= dx_bound[rows]).all(), f"dX, expert {e}: {np.max(dx_err[rows] / dx_bound[rows]):.2f}x"
    assert (dw_err[e] <= dw_bound[e]).all(), f"dW[{e}]: worst excess {np.max(dw_err[e] / dw_bound[e]):.2f}x the bound"
  assert (dx_s[:, ~ref.valid] == 0).all() and (dw_s[:, 1] == 0).all()  # padding rows, empty expert


def test_round_to_nearest_is_visibly_biased_per_expert_where_stochastic_rounding_is_not():
  x, w, g, ref = _problem()
  dx_rtne, dw_rtne = (np.asarray(a, np.float64) for a in _grads("int8_rtne", jnp.asarray(x), jnp.asarray(w), g, None))
  dx_s, dw_s = _samples("int8_sr")
  dx_bound, dw_bound = _bounds("int8_sr", dx_s, dw_s, ref)
  assert np.mean(np.abs(dx_rtne - ref.dx)[ref.valid] > dx_bound[ref.valid]) > 0.25
  for e in (0, 2, 3):
    assert np.mean(np.abs(dw_rtne[e] - ref.dw[e]) > dw_bound[e]) > 0.25


def _structured(e, seg):
  """e_str per segment (float64): row means + segment column means - segment mean; 0 on padding rows."""
  out = np.zeros_like(e)
  for s in range(E):
    rows = seg == s
    if rows.any():
      es = e[rows]
      out[rows] = es.mean(axis=1, keepdims=True) + es.mean(axis=0, keepdims=True) - es.mean()
  return out


def test_segment_factors_leave_an_error_whose_rows_and_segment_columns_sum_to_zero():
  _, _, _, ref = _problem()
  e = np.random.default_rng(0).uniform(-1, 1, (T, N)) * ref.valid[:, None]
  factors = grouped_ec.segment_factors(
    jnp.asarray(e, jnp.float32), jnp.asarray(ref.seg, jnp.int32), jnp.asarray(SIZES, jnp.int32)
  )
  r, c, m = (np.asarray(a, np.float64) for a in factors)
  seg_c = np.minimum(ref.seg, E - 1)
  resid = np.where(ref.valid[:, None], e - (r[:, None] + c[seg_c] - m[seg_c][:, None]), 0)
  np.testing.assert_allclose(resid.sum(axis=1), 0, atol=1e-5)
  for s in range(E):
    np.testing.assert_allclose(resid[ref.seg == s].sum(axis=0), 0, atol=1e-5)
  np.testing.assert_allclose(resid, e - _structured(e, ref.seg), atol=1e-6)
  assert (c[1] == 0).all() and m[1] == 0  # the empty segment


@pytest.mark.parametrize("recipe", ["s3r_ec", "s3r_ec_dx", "s3r_ec_dw", "s3r_ec_bcast", "s3r_ec_dx_bcast"])
def test_ec_gradients_equal_exact_plus_a_residual_error_summing_to_zero_per_segment(recipe):
  """dX = (Δ/s_x)(v + e_res)Ŵ_eᵀ and dW[e] = (Δ/s_w[e]) X̂_eᵀ(v + e_res)_e for corrected
  products (the closed-form corrections equal the projection); uncorrected ones keep e."""
  r = s3r.recipe(recipe)
  x, w, g, ref = _problem()
  key = jax.random.key(9)
  dx, dw = (np.asarray(a, np.float64) for a in jax.jit(_grads, static_argnums=0)(recipe, x, w, g, key))
  if r.dx_topology == "token":
    u = np.asarray(thresholds.compact_uniform(key, T), np.float64)[:, None]
  else:
    u = np.asarray(thresholds.compact_uniform(key, E), np.float64)[np.minimum(ref.seg, E - 1)][:, None]
  v = ref.gp / ref.delta
  e = np.clip(np.floor(v + u), -127, 127) - v
  e_res = e - _structured(e, ref.seg)
  np.testing.assert_allclose(e_res.sum(axis=1), 0, atol=1e-9)
  for s in range(E):
    np.testing.assert_allclose(e_res[ref.seg == s].sum(axis=0), 0, atol=1e-9)
  codes_dx = v + (e_res if r.correct_dx else e)
  codes_dw = v + (e_res if r.correct_dw else e)
  dx_expected = (ref.delta / ref.sx[:, None]) * np.einsum("tn,tkn->tk", codes_dx, ref.wq_rows)
  xq = ref.xq.astype(np.float64)
  dw_expected = np.stack([(ref.delta / ref.sw[s]) * (xq[ref.seg == s].T @ codes_dw[ref.seg == s]) for s in range(E)])
  np.testing.assert_allclose(dx, dx_expected, rtol=1e-4, atol=1e-5 * np.abs(dx_expected).max())
  np.testing.assert_allclose(dw, dw_expected, rtol=1e-4, atol=1e-5 * np.abs(dw_expected).max())


THM_DRAWS = 128


@functools.cache
def _dx_sq_errors(recipe):
  """Per-key squared dX error on experts whose W_e has a common row component a_e 1ᵀ."""
  rng = np.random.default_rng(3)
  sizes, k, n = (24, 40), 32, 48
  x = rng.standard_normal((sum(sizes), k)).astype(np.float32)
  w = (rng.standard_normal((2, k, 1)) + 0.1 * rng.standard_normal((2, k, n))).astype(np.float32)
  g = rng.standard_normal((sum(sizes), n)).astype(np.float32)
  ref = GroupedReference(x, w, sizes, g)
  keys = jax.random.split(jax.random.key(0), THM_DRAWS)
  dx = jax.jit(jax.vmap(lambda kk: _grads(recipe, jnp.asarray(x), jnp.asarray(w), g, kk, sizes)[0]))(keys)
  return ((np.asarray(dx, np.float64) - ref.dx) ** 2).sum(axis=(1, 2))


def _welch_larger(a, b, alpha=1e-6):
  return stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue < alpha


def test_error_correction_per_segment_has_smaller_dx_error_than_uncorrected_s3r():
  assert _welch_larger(_dx_sq_errors("s3r"), _dx_sq_errors("int8_sr"))  # Prop. 1: the shared threshold costs
  assert _welch_larger(_dx_sq_errors("s3r"), _dx_sq_errors("s3r_ec_dx"))  # Thm. 1: EC removes it
  assert _welch_larger(_dx_sq_errors("s3r_bcast"), _dx_sq_errors("s3r_ec_bcast"))
