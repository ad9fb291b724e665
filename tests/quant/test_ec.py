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


def _wc(c, wq):
  """Ŵ c_b for every example b, as ec.dx_correction computes it (token means r = m = 0), [B, K]."""
  batch = c.shape[0]
  corr = jax.jit(ec.dx_correction)(
    jnp.zeros((batch, 1)), jnp.asarray(c, jnp.float32), jnp.zeros(batch), jnp.asarray(wq, jnp.int8)
  )
  return np.asarray(corr, np.float64)[:, 0, :]


def test_channel_mean_digits_are_int8_and_sum_to_c_on_a_2_to_the_minus_20_grid():
  extremes = [
    1.0,
    -1.0,
    127.5 / 128,
    -127.5 / 128,
    0.0,
    2.0**-21,
    3 * 2.0**-21,
    64 * 2.0**-20,
    192 * 2.0**-20,
    (2**14 - 0.5) * 2.0**-20,
    0.5 + 2.0**-21,
  ]
  c = np.concatenate([extremes, np.random.default_rng(5).uniform(-1, 1, 500)]).astype(np.float32)[None]
  d = np.asarray(ec.int8_digits(jnp.asarray(c)))
  assert d.dtype == np.int8 and d.shape == (1, 3, c.shape[1]) and np.abs(d).max() <= 64
  x = (d.astype(np.int64) * 128 ** np.arange(3)[None, :, None]).sum(axis=1)
  np.testing.assert_array_equal(x, np.round(c.astype(np.float64) * 2**20))  # exact, half to even
  assert np.abs(x / 2**20 - c).max() <= 2.0**-21


@pytest.mark.parametrize("n", [10, 4096])
def test_int8_digit_product_equals_the_float_product_within_the_digit_rounding_bound(n):
  """Ŵ c from int8 digits vs the exact (float64) Ŵ c: c is rounded to a 2^-20 grid, so the
  error is at most 2^-21 Σ_n |Ŵ_kn| (≤ 2^-21 · 127 N), plus the f32 recombination of the three
  exact int32 partial products: five f32 roundings (three conversions, two additions), each
  at most 2^-24 of Σ_j 128^j |Σ_n Ŵ_kn d_jn| / 2^20 ≤ Σ_n |Ŵ_kn| · 64 (1 + 128 + 128²) / 2^20."""
  rng = np.random.default_rng(6)
  batch, k = 3, 24
  wq = rng.integers(-127, 128, (k, n)).astype(np.int8)
  wq[0] = 127  # a row of extreme codes
  c = rng.uniform(-1, 1, (batch, n)).astype(np.float32)
  c[0, : n // 2] = 1.0  # extreme channel means
  c[1] = rng.uniform(-1e-3, 1e-3, n)  # typical magnitudes (mean of many tokens' errors)
  got = _wc(c, wq)
  exact = c.astype(np.float64) @ wq.T.astype(np.float64)
  abs_rowsum = np.abs(wq.astype(np.float64)).sum(axis=1)
  digit_bound = 2.0**-21 * abs_rowsum
  f32_bound = 5 * 2.0**-24 * abs_rowsum * 64 * (1 + 128 + 128**2) / 2**20
  assert (abs_rowsum <= 127 * n).all()
  err = np.abs(got - exact)
  assert (err <= digit_bound + f32_bound).all(), (err / (digit_bound + f32_bound)).max()
  # the bound is not vacuous: the digit rounding error shows up at about its expected size
  assert err.max() > 2.0**-21 * np.sqrt(n)


def test_int8_digit_product_does_not_overflow_int32_at_n_2_to_the_18():
  # The largest |d_j · Ŵ_kn| is 64 · 127, so the int32 sums stay exact while 64 · 127 N < 2^31.
  n = 2**18
  assert 64 * 127 * n < 2**31
  wq = np.full((2, n), 127, np.int8)
  wq[1] = -127
  c = np.stack([np.ones(n), -np.ones(n)]).astype(np.float32)  # top digit ±64 everywhere
  np.testing.assert_array_equal(_wc(c, wq), [[127 * n, -127 * n], [-127 * n, 127 * n]])


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

  assert r.dx_topology is not None  # a shared recipe
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


@functools.cache
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


def test_gathered_factors_false_leaves_the_placement_of_the_dw_factors_to_xla():
  # Auto axes, as the trainer's meshes have (an AbstractMesh defaults to Explicit axes since JAX 0.11)
  mesh = jax.sharding.AbstractMesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  args = (jnp.zeros((16, 4)), jnp.zeros((16, 8)), jnp.zeros((16,)), jnp.zeros((6, 64), jnp.int8))

  def constraints():
    with jax.sharding.use_abstract_mesh(mesh):
      jaxpr = jax.make_jaxpr(lambda *a: ec.dw_correction(*a))(*args)  # a fresh function: traced anew
    return sum(e.primitive.name == "sharding_constraint" for e in jaxpr.eqns)

  assert constraints() == 2  # x̄ gathered along B, c along B
  with ec.gathered_factors(False):
    assert constraints() == 0
  assert constraints() == 2  # the option ends with its context
