"""S3R-EC: the closed-form corrections equal the dense projection of the rounding error, and
they lower the activation-gradient error where the shared threshold raises it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import s3r
from s3r.quant import ec, thresholds
from tests.quant.reference import Reference, grads, heavy_tailed

B, S, K, N = 3, 12, 16, 10


def _structured(e):
  """Dense e_str = r 1ᵀ + 1 cᵀ - m 1 1ᵀ per example (float64)."""
  r = e.mean(axis=2, keepdims=True)
  c = e.mean(axis=1, keepdims=True)
  m = e.mean(axis=(1, 2), keepdims=True)
  return r + c - m


def test_ec_factors_leave_an_error_whose_rows_and_columns_sum_to_zero():
  e = np.random.default_rng(0).uniform(-1, 1, (B, S, N))
  r, c, m = (np.asarray(a, np.float64) for a in ec.error_factors(jnp.asarray(e, jnp.float32)))
  resid = e - (r[:, :, None] + c[:, None, :] - m[:, None, None])
  np.testing.assert_allclose(resid.sum(axis=2), 0, atol=1e-5)
  np.testing.assert_allclose(resid.sum(axis=1), 0, atol=1e-5)
  np.testing.assert_allclose(resid, e - _structured(e), atol=1e-6)


@pytest.mark.parametrize("recipe", ["s3r_ec", "s3r_ec_dx", "s3r_ec_dw", "s3r_ec_bcast", "s3r_ec_dx_bcast"])
def test_ec_gradients_equal_exact_plus_residual_error_with_zero_row_and_column_sums(recipe):
  """dX = (Δ/s_x)(v + e_res)Ŵᵀ and dW = (Δ/s_w) Σ_b X̂_bᵀ(v + e_res) for corrected products,
  where v = G'/Δ and e_res = e - e_str: the error left sums to zero along every row and
  column of each example. The uncorrected product keeps the full error e."""
  r = s3r.recipe(recipe)
  rng = np.random.default_rng(2)
  x = rng.standard_normal((B, S, K)).astype(np.float32)
  w = rng.standard_normal((K, N)).astype(np.float32)
  g = heavy_tailed(rng, (B, S, N), decades=2)
  ref = Reference(x, w, g)
  key = jax.random.key(9)
  dx, dw = (np.asarray(a, np.float64) for a in grads(recipe, jnp.asarray(x), jnp.asarray(w), g, key))

  u = np.asarray(thresholds.shared_thresholds(key, B, S, r.dx_topology), np.float64)
  v = ref.gp / ref.delta
  q = np.clip(np.floor(v + u), -127, 127)
  e = q - v
  e_res = e - _structured(e)
  np.testing.assert_allclose(e_res.sum(axis=2), 0, atol=1e-9)
  np.testing.assert_allclose(e_res.sum(axis=1), 0, atol=1e-9)

  wq, xq = ref.wq.astype(np.float64), ref.xq.astype(np.float64)
  codes_dx = v + (e_res if r.correct_dx else e)
  codes_dw = v + (e_res if r.correct_dw else e)
  dx_expected = (ref.delta / ref.sx[..., None]) * (codes_dx @ wq.T)
  dw_expected = (ref.delta / ref.sw) * np.einsum("bsk,bsn->kn", xq, codes_dw)
  np.testing.assert_allclose(dx, dx_expected, rtol=1e-4, atol=1e-5 * np.abs(dx_expected).max())
  np.testing.assert_allclose(dw, dw_expected, rtol=1e-4, atol=1e-5 * np.abs(dw_expected).max())


DRAWS = 256


@functools.lru_cache(maxsize=None)
def _dx_sq_errors(recipe):
  """Per-key squared dX error ||dX - exact||² on a layer whose W has a common row component."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 32, 32)).astype(np.float32)
  # Every row k of W carries an offset a_k shared by all N output channels: rowsum(Ŵ) is
  # large, so an error that is constant along a token's channels reaches dX N-fold.
  w = (rng.standard_normal((32, 1)) + 0.1 * rng.standard_normal((32, 48))).astype(np.float32)
  g = rng.standard_normal((2, 32, 48)).astype(np.float32)
  ref = Reference(x, w, g)
  keys = jax.random.split(jax.random.key(0), DRAWS)
  dx = jax.jit(jax.vmap(lambda k: grads(recipe, jnp.asarray(x), jnp.asarray(w), g, k)[0]))(keys)
  return ((np.asarray(dx, np.float64) - ref.dx) ** 2).sum(axis=(1, 2, 3))


def _welch_larger(a, b, alpha=1e-6):
  """True when mean(a) > mean(b) at one-sided level alpha (Welch's t)."""
  t, p = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
  return p < alpha


def test_shared_per_token_threshold_has_larger_dx_error_than_independent_sr():
  # Proposition 1: the shared threshold correlates a token's errors across channels.
  assert _welch_larger(_dx_sq_errors("s3r"), _dx_sq_errors("int8_sr"))


def test_error_correction_has_smaller_dx_error_than_uncorrected_s3r():
  # Theorem 1: subtracting e_str removes the row-constant part that Ŵ's row sums amplify.
  assert _welch_larger(_dx_sq_errors("s3r"), _dx_sq_errors("s3r_ec"))
  assert _welch_larger(_dx_sq_errors("s3r"), _dx_sq_errors("s3r_ec_dx"))
  assert _welch_larger(_dx_sq_errors("s3r_bcast"), _dx_sq_errors("s3r_ec_bcast"))
