"""The gradient formats beyond INT8: codes against NumPy references, square blocks (partial ones
included), the per-element bias of shared 7-bit thresholds on every grid, and the recipe lookup."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import s3r
from s3r.quant import formats, thresholds
from s3r.quant.formats import FORMATS, BlockScaledFormat
from tests.quant import format_reference as ref
from tests.quant.reference import heavy_tailed, np_scale

NEW = [n for n in FORMATS if n != "int8"]  # every gradient format beyond the forward's int8
FP4 = [n for n, f in FORMATS.items() if f.grid == "e2m1"]
BLOCK_SCALED = [n for n, f in FORMATS.items() if isinstance(f, BlockScaledFormat)]  # FP4 and block-scaled FP8
FP8 = [n for n, f in FORMATS.items() if f.grid == "float"]
NOT_GROUPED = [n for n, f in FORMATS.items() if not f.capabilities.grouped]
NOT_COLUMN_TP = [n for n, f in FORMATS.items() if not f.capabilities.column_tp]
NOT_INTEGER = [n for n, f in FORMATS.items() if not f.capabilities.integer_codes]


def _problem(rng, shape_BxSxK, n):
  x = rng.standard_normal(shape_BxSxK).astype(np.float32)
  w = (rng.standard_normal((shape_BxSxK[-1], n)) * 0.3).astype(np.float32)
  g = heavy_tailed(rng, shape_BxSxK[:-1] + (n,), decades=4)
  return x, w, g


def _scaled_gradient(fmt, x, w, g):
  """(Δ, v = G'/Δ as [T, N]) in f32, computed as the layer does (products in the same order)."""
  sx, sw = np_scale(x, axis=-1), np_scale(w, axis=0)
  gp = sx[..., None] * g.astype(np.float32) * sw
  delta = ref.step(fmt, np.abs(gp).max())
  return delta, (gp * (np.float32(1) / delta)).reshape(-1, g.shape[-1])


@pytest.mark.parametrize("fmt", NEW + ["int8"])
@pytest.mark.parametrize("shape", [(2, 16, 24), (3, 7, 24)])  # (3, 7): T = 21, N = 40 end in partial blocks
def test_rtne_codes_and_step_match_the_numpy_reference_exactly(fmt, shape, rng):
  x, w, g = _problem(rng, shape, 40)
  q_dx, q_dw, delta = s3r.gradient_codes(jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), recipe=f"int8_rtne@{fmt}")
  delta_ref, v = _scaled_gradient(fmt, x, w, g)
  assert np.float32(delta) == delta_ref
  expected = ref.rtne_codes(fmt, v)
  np.testing.assert_array_equal(np.asarray(q_dx, np.float64).reshape(v.shape), expected)
  assert q_dx is q_dw or np.array_equal(np.asarray(q_dx), np.asarray(q_dw))
  assert np.asarray(q_dx).dtype == FORMATS[fmt].code_dtype


@pytest.mark.parametrize("fmt", FP4)
def test_fp4_rtne_rounds_each_tie_to_the_even_code(fmt):
  f = FORMATS[fmt]
  w = np.array([[6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -2.5, -5, 5.9, -6, 0.1, 4.9]], np.float32)
  expected = [[6, 0, 1, 1, 2, 2, 4, 4, 0, -1, -2, -4, 6, -6, 0, 4]]
  np.testing.assert_array_equal(np.asarray(f.round(jnp.asarray(w))), expected)  # block max 6: s_blk = 1


@pytest.mark.parametrize("fmt", BLOCK_SCALED)
def test_block_scales_bound_every_element_by_the_largest_element_and_are_e4m3_or_powers_of_two(fmt, rng):
  f = FORMATS[fmt]
  assert isinstance(f, BlockScaledFormat)
  v = heavy_tailed(rng, (37, 45) if f.block < 37 else (150, 133), decades=6)  # partial last blocks along both dims
  v = _in_units_of_the_step(f, v)
  s = np.asarray(formats.expand_blocks(f.block_scales(jnp.asarray(v)), v.shape, f.block))
  np.testing.assert_array_equal(s, ref.block_scales(fmt, v))
  # nothing is clipped (up to the f32 rounding of max/qmax), so SR stays unbiased
  assert (np.abs(v) <= f.qmax * s * (1 + 2.0**-21)).all()
  if f.block_scale == "e8m0":
    assert (np.log2(s) == np.round(np.log2(s))).all()
  else:
    assert (s.astype(jnp.float8_e4m3fn).astype(np.float32) == s).all()


@pytest.mark.parametrize("fmt", BLOCK_SCALED)
def test_a_partial_last_block_quantizes_as_the_zero_padded_tensor_does(fmt, rng):
  f = FORMATS[fmt]
  assert isinstance(f, BlockScaledFormat)
  v = heavy_tailed(rng, (21, 40), decades=4)
  rows, cols = (-(-d // f.block) * f.block for d in v.shape)
  padded = np.zeros((rows, cols), np.float32)
  padded[:21, :40] = v
  u = jnp.asarray(rng.uniform(0, 1, (21, 1)), jnp.float32)
  u_padded = jnp.zeros((rows, 1), jnp.float32).at[:21].set(u)
  for t, tp in ((None, None), (u, u_padded)):
    np.testing.assert_array_equal(
      np.asarray(f.round(jnp.asarray(v), t)), np.asarray(f.round(jnp.asarray(padded), tp))[:21, :40]
    )


def _in_units_of_the_step(f, v):
  """v rescaled so that its max is what the format's step maps max|G'| onto (v = G'/Δ); as is without a step."""
  return v if f.tensor_max is None else v * np.float32(f.tensor_max / np.abs(v).max())


@pytest.mark.parametrize("fmt", NEW + ["int8"])
def test_seven_bit_shared_thresholds_are_unbiased_per_element_up_to_the_grid_gap_over_256(fmt, rng):
  # Exact expectation over all 128 threshold values: |E[code] - v| <= (hi - lo)/256 in units of Δ
  # (1/256 on a uniform grid, (hi - lo) · s_blk / 256 on E2M1), plus f32 rounding of v + u.
  f = FORMATS[fmt]
  v = _in_units_of_the_step(f, heavy_tailed(rng, (40, 36), decades=4))
  u = thresholds.threshold_values()
  codes = jax.vmap(lambda t: f.dequantize(f.round(jnp.asarray(v), t)))(u)
  mean = np.asarray(codes, np.float64).mean(axis=0)
  gap = ref.code_gap(fmt, v)
  assert (np.abs(mean - v) <= gap / 256 + 1e-6 * (np.abs(v) + gap)).all()
  # ...and the bound is attained up to the 7-bit resolution: an RTNE-like rule would be far off
  assert np.max(np.abs(mean - v) / gap) > 1 / 512


@pytest.mark.parametrize("fmt", NEW + ["int8"])
def test_seven_bit_threshold_variance_is_p_one_minus_p_times_the_gap_squared_per_element(fmt, rng):
  # Exact over all 128 threshold values: each code is lo or hi, hi with probability P, |P - p| <= 1/256,
  # so Var[code] = P(1 - P) d² is within d²/256 of p(1 - p) d² (d = hi - lo, the element's own gap: on
  # an FP8 grid it grows with |v|, so the noise is relative to each element's magnitude).
  f = FORMATS[fmt]
  v = _in_units_of_the_step(f, heavy_tailed(rng, (40, 36), decades=4))
  u = thresholds.threshold_values()
  codes = np.asarray(jax.vmap(lambda t: f.dequantize(f.round(jnp.asarray(v), t)))(u), np.float64)
  lo, hi = ref.neighbours(fmt, v)
  assert ((codes == lo) | (codes == hi)).all()
  d = hi - lo
  p = (v - lo) / d
  var = codes.var(axis=0)
  assert (np.abs(var - p * (1 - p) * d**2) <= d**2 / 256 + 1e-6 * (np.abs(v) + d) ** 2).all()
  assert np.max(var / d**2) > 0.2  # elements mid-gap: far from the zero variance of round-to-nearest


@pytest.mark.parametrize("fmt", NEW)
def test_shared_per_token_draws_choose_the_upper_neighbour_with_probability_p(fmt, rng):
  # Sampled through the layer's own draws (one threshold per token). Each element's code is lo or
  # hi (its grid neighbours), and the number of draws giving hi is Binomial(draws, P) with
  # |P - p| <= 1/256 (p = (v - lo)/(hi - lo), the 7-bit bias): the count must lie within that
  # binomial's two-sided quantiles at a Bonferroni-corrected level over the elements.
  f, draws = FORMATS[fmt], 400
  v = _in_units_of_the_step(f, heavy_tailed(rng, (24, 36), decades=4))
  keys = jax.random.split(jax.random.key(7), draws)
  u_draws = jax.vmap(lambda k: thresholds.shared_thresholds(k, 1, 24, "token")[0])(keys)
  q = np.asarray(jax.vmap(lambda u: f.dequantize(f.round(jnp.asarray(v), u)))(u_draws), np.float64)
  lo, hi = ref.neighbours(fmt, v)
  assert ((q == lo) | (q == hi)).all()
  p = (v - lo) / (hi - lo)
  alpha = 1e-3 / (2 * v.size)
  low = stats.binom.ppf(alpha, draws, np.clip(p - 1 / 256, 0, 1))
  high = stats.binom.isf(alpha, draws, np.clip(p + 1 / 256, 0, 1))
  hits = (q == hi).sum(axis=0)
  assert ((low <= hits) & (hits <= high)).all()
  # the same draws are far from another rule: always rounding half up would fail the check
  rtne_hits = draws * (p >= 0.5)
  assert not ((low <= rtne_hits) & (rtne_hits <= high)).all()


def test_int8_at_format_int8_is_bitwise_the_registered_recipe(rng):
  x, w, g = (jnp.asarray(a) for a in _problem(rng, (2, 8, 16), 12))
  for name in ("s3r", "int8_sr", "s3r_ec_dx"):
    a = s3r.gradient_codes(x, w, g, key=jax.random.key(3), recipe=name)
    b = s3r.gradient_codes(x, w, g, key=jax.random.key(3), recipe=f"{name}@int8")
    for p, q in zip(a, b):
      np.testing.assert_array_equal(np.asarray(p), np.asarray(q))


def test_recipe_at_a_format_is_the_base_recipe_with_that_gradient_format():
  for fmt in FORMATS:
    r = s3r.recipe(f"s3r_ec_dx@{fmt}")
    assert r == dataclasses.replace(s3r.RECIPES["s3r_ec_dx"], grad_format=fmt, name=f"s3r_ec_dx@{fmt}")
  assert s3r.recipe(s3r.recipe("s3r@int4")).grad_format == "int4"


@pytest.mark.parametrize(
  "name, message",
  [
    ("bf16@int4", "'bf16' does not quantize the gradient"),
    ("int8_exact_bwd@nvfp4", "'int8_exact_bwd' does not quantize the gradient"),
    ("s3r@int3", f"unknown gradient format 'int3'; valid formats: {', '.join(FORMATS)}"),
    ("nope@int4", "unknown recipe 'nope'"),
  ],
)
def test_recipe_lookup_refuses_a_format_without_a_quantized_gradient_or_an_unknown_name(name, message):
  with pytest.raises(ValueError, match=message) as err:
    s3r.recipe(name)
  assert "\n" not in str(err.value)


def test_recipes_without_a_quantized_gradient_keep_int8_as_their_format():
  with pytest.raises(ValueError, match="grad_format must be 'int8' when rounding='none'"):
    s3r.Recipe(name="x", rounding="none", grad_format="int4")


def test_grouped_path_refuses_the_formats_without_the_grouped_capability_and_takes_the_others(rng):
  x = jnp.asarray(rng.standard_normal((12, 8)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((2, 8, 6)), jnp.float32)
  sizes = jnp.asarray([5, 7], jnp.int32)
  assert set(NOT_GROUPED) == set(BLOCK_SCALED)  # FP8 codes: exact f32 emulations on the tiled and ragged GEMMs
  for fmt in NOT_GROUPED:
    with pytest.raises(ValueError, match=f"grouped_qmatmul: gradient format '{fmt}'.*grouped \\(expert\\) path"):
      s3r.grouped_qmatmul(x, w, sizes, key=jax.random.key(0), recipe=f"s3r@{fmt}")
  for fmt in formats.formats_with("grouped"):
    dx, dw = jax.grad(
      lambda a, b: jnp.sum(s3r.grouped_qmatmul(a, b, sizes, key=jax.random.key(0), recipe=f"s3r_ec@{fmt}")), (0, 1)
    )(x, w)
    assert bool(jnp.isfinite(dx).all() & jnp.isfinite(dw).all())


@pytest.mark.parametrize("fmt", NOT_COLUMN_TP)
def test_column_tensor_parallelism_refuses_the_emulated_formats_only_under_a_split_tensor_axis(fmt, rng):
  x = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
  key = jax.random.key(0)
  # No mesh (one device, as the models mark their projections by default): nothing is split, FP4 works.
  assert s3r.qmatmul(x, w, key=key, recipe=f"s3r@{fmt}", tp="column").shape == (4, 6)
  mesh = jax.sharding.AbstractMesh((2,), ("tensor",), axis_types=(jax.sharding.AxisType.Auto,))
  with jax.sharding.use_abstract_mesh(mesh):
    with pytest.raises(ValueError, match=f"gradient format '{fmt}'.*tp='column'"):
      jax.make_jaxpr(lambda a, b: s3r.qmatmul(a, b, key=key, recipe=f"s3r@{fmt}", tp="column"))(x, w)
    jax.make_jaxpr(lambda a, b: s3r.qmatmul(a, b, key=key, recipe="s3r@int4", tp="column"))(x, w)


@pytest.mark.parametrize("fmt", NOT_INTEGER)
def test_a_non_finite_gradient_gives_non_finite_gradients_at_the_float_code_formats(fmt, rng):
  x = jnp.asarray(rng.standard_normal((1, 16, 8)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
  g = jnp.ones((1, 16, 6), jnp.float32).at[0, 3, 2].set(jnp.inf)
  _, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=jax.random.key(0), recipe=f"s3r_ec@{fmt}"), x, w)
  dx, dw = vjp(g)
  assert not bool(jnp.isfinite(dx).all()) and not bool(jnp.isfinite(dw).all())


@pytest.mark.parametrize("fmt", [n for n, f in FORMATS.items() if f.grid == "block_float"])
def test_a_block_of_small_gradients_keeps_its_relative_precision_with_block_scales_and_not_with_a_tensor_step(fmt, rng):
  # One block of G' holds gradients 1e-6 of the tensor's max: the per-tensor E4M3 step puts them
  # among E4M3's subnormals (or at zero); their own block's power-of-two scale puts them in its
  # normal range, where round to nearest errs by at most 2^-4 of each value.
  f = FORMATS[fmt]
  assert isinstance(f, BlockScaledFormat)
  b = f.block
  g = rng.uniform(0.5, 1.0, (2 * b, 2 * b)).astype(np.float32) * rng.choice([-1, 1], (2 * b, 2 * b))
  g[:b, :b] *= np.float32(1e-6)
  small = g[:b, :b].astype(np.float64)
  blocked = np.asarray(f.dequantize(f.round(jnp.asarray(g), None)), np.float64)[:b, :b]  # Δ = 1
  assert (np.abs(blocked - small) <= 2.0**-4 * np.abs(small)).all()
  tensor = FORMATS["e4m3"]
  delta = tensor.scale(jnp.max(jnp.abs(jnp.asarray(g))))
  per_tensor = np.asarray(tensor.dequantize(tensor.round(jnp.asarray(g) / delta, None), delta), np.float64)[:b, :b]
  assert np.median(np.abs(per_tensor - small) / np.abs(small)) > 0.25
