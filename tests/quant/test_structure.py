"""Program structure: three int8 GEMMs (plus S3R-EC's one small int8 factor product), one
quantized gradient, few random words, no full-size threshold tensor in memory, and no
weight-sized correction temporary."""

import math

import jax
import jax.numpy as jnp
import pytest

import s3r
from labtools.analysis import hlo
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis.jaxpr import shaped

B, S, K, N = 4, 64, 96, 160  # distinct sizes: B*S*N, B*S*K and K*N never coincide
INT8 = [n for n, r in s3r.RECIPES.items() if r.quantized_gradient]


def _fwd_bwd(recipe):
  def f(x, w, g, key):
    y, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=key, recipe=recipe), x, w)
    return y, vjp(g)

  args = (jnp.zeros((B, S, K), jnp.bfloat16), jnp.zeros((K, N)), jnp.zeros((B, S, N), jnp.bfloat16), jax.random.key(0))
  return f, args


def _jaxpr(recipe):
  f, args = _fwd_bwd(recipe)
  return jax.make_jaxpr(f)(*args)


def _has_token_dim(dot):
  """An operand spans the B*S tokens: the forward GEMM, or the dX or dW GEMM of the backward."""
  return any(B * S in shaped(v).shape for v in dot.invars)


@pytest.mark.parametrize("recipe", INT8)
def test_fwd_and_bwd_have_three_int8_gemms_plus_one_ec_factor_product_when_correcting_dx(recipe):
  # The three GEMMs of docs/algorithm.md §1 (forward, dX, dW) each have a token dimension. A recipe
  # that corrects dX adds one small int8 dot of the error's channel-mean digits (3 rows per
  # example) and a row of ones with Ŵ: [3B + 1, N] x [K, N] -> [3B + 1, K] (ec.dx_correction).
  dots = jaxpr_analysis.int8_dots(_jaxpr(recipe))
  assert all(shaped(d.outvars[0]).dtype == jnp.int32 for d in dots)
  gemms = [d for d in dots if _has_token_dim(d)]
  assert len(gemms) == 3
  ec_products = [d for d in dots if not _has_token_dim(d)]
  expected = [((3 * B + 1, N), (K, N))] if s3r.recipe(recipe).correct_dx else []
  assert [tuple(shaped(v).shape for v in d.invars) for d in ec_products] == expected


def test_bf16_recipe_has_no_int8_dot():
  assert jaxpr_analysis.int8_dots(_jaxpr("bf16")) == []


@pytest.mark.parametrize(
  "recipe, words",
  [
    ("int8_rtne", 0),
    ("int8_sr", 2 * B * S * N),
    ("s3r", math.ceil(B * S / 4)),
    ("s3r_ec_dx", math.ceil(B * S / 4)),
    ("s3r_bcast", math.ceil(B / 4)),
    ("s3r_split_dx2d_dwbcast", math.ceil(B * S / 4) + math.ceil(B / 4)),
  ],
)
def test_random_words_drawn_per_recipe(recipe, words):
  assert jaxpr_analysis.random_words(_jaxpr(recipe)) == words


def _gradient_quantizations(jaxpr):
  """Conversions of a full-size [B, S, N] array to int8: one per quantization of G'."""
  return [
    e
    for e in jaxpr_analysis.iter_eqns(jaxpr)
    if e.primitive.name == "convert_element_type"
    and e.params["new_dtype"] == jnp.int8
    and math.prod(shaped(e.invars[0]).shape) == B * S * N
  ]


@pytest.mark.parametrize("recipe", INT8)
def test_upstream_gradient_is_quantized_once_except_for_split_recipes(recipe):
  jaxpr = _jaxpr(recipe)
  expected = 2 if s3r.recipe(recipe).split else 1
  assert len(_gradient_quantizations(jaxpr)) == expected
  # ...and, when shared, the very same int8 tensor feeds both backward GEMMs
  q_vars = {e.outvars[0] for e in _gradient_quantizations(jaxpr)}
  reshaped = {
    e.outvars[0] for e in jaxpr_analysis.iter_eqns(jaxpr) if e.primitive.name == "reshape" and e.invars[0] in q_vars
  }
  consumers = [d for d in jaxpr_analysis.int8_dots(jaxpr) if set(d.invars) & (q_vars | reshaped)]
  assert len(consumers) == 2


def _compiled_buffers(recipe):
  f, args = _fwd_bwd(recipe)
  return hlo.full_size_buffers(hlo.compiled_text(f, *args), B * S * N)


@pytest.mark.parametrize("recipe", ["s3r", "s3r_bcast", "s3r_ec_dx"])
def test_full_size_threshold_tensor_is_never_materialized(recipe):
  # The thresholds are broadcast inside the quantizer fusion: no full-size random bits or
  # uniforms reach memory, and plain S3R keeps exactly RTNE's full-size buffers.
  buffers = _compiled_buffers(recipe)
  assert not [b for b in buffers if b[1] in ("u32", "u8", "u16")], buffers
  if not s3r.recipe(recipe).correct_dx:
    assert sorted(b[1] for b in buffers) == sorted(b[1] for b in _compiled_buffers("int8_rtne"))


def test_independent_sr_materializes_full_size_random_bits():
  # The contrast that shows the check above can fail.
  assert [b for b in _compiled_buffers("int8_sr") if b[1] == "u32"]


def _weight_sized(recipe):
  f, args = _fwd_bwd(recipe)
  return sorted(b[1] for b in hlo.full_size_buffers(hlo.compiled_text(f, *args), K * N))


def test_dw_correction_adds_no_weight_sized_temporary_beyond_dw():
  # s3r_ec differs from s3r_ec_dx only by the dW correction, which must fuse into the rescale
  # of the int32 dW accumulator: no weight-sized buffer may be added (for example an f32 copy
  # of the accumulator or a [K, N] f32 rank-B product).
  assert _weight_sized("s3r_ec") == _weight_sized("s3r_ec_dx")
  assert _weight_sized("s3r") == _weight_sized("int8_rtne") == ["f32", "s32", "s8"]


def test_dx_correction_reads_the_int8_weight_codes_without_an_f32_copy():
  # Ŵc comes from an int8 dot of c's digits with Ŵ: no weight-sized f32 (or other) buffer
  # beyond plain S3R's. Computed as an f32 product, XLA writes Ŵ out as f32 [K, N] first.
  assert _weight_sized("s3r_ec_dx") == _weight_sized("s3r")
