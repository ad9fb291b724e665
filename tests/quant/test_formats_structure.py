"""Program structure at the gradient formats beyond INT8: the uniform grids keep the int8 program
(three int8 GEMMs, one int8 quantization of G'); the block-scaled grids (FP4, FP8 elements) round G' once, with one
square-block scale computation, and that one tensor of codes feeds both backward GEMMs (f32
emulations), with the same compact thresholds as INT8."""

import math
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import s3r
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis.jaxpr import shaped
from s3r.quant.formats import FORMATS, BlockScaledFormat

B, S, K, N = 4, 20, 96, 72  # T = 80 and N = 72: partial blocks of 16 and 32 along N, of 32 along T
SHARED = ["int8_rtne", "s3r", "s3r_bcast", "s3r_ec", "s3r_ec_dx"]
SPLIT = ["int8_sr", "s3r_split_dx2d_dwbcast"]
UNIFORM = [n for n, f in FORMATS.items() if f.grid == "uniform" and n != "int8"]
BLOCK_SCALED = [n for n, f in FORMATS.items() if isinstance(f, BlockScaledFormat)]  # FP4 and block-scaled FP8
FP8 = [n for n, f in FORMATS.items() if f.grid == "float"]


def _jaxpr(recipe):
  def f(x, w, g, key):
    y, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=key, recipe=recipe), x, w)
    return y, vjp(g)

  args = (jnp.zeros((B, S, K), jnp.bfloat16), jnp.zeros((K, N)), jnp.zeros((B, S, N), jnp.bfloat16), jax.random.key(0))
  return jax.make_jaxpr(f)(*args)


def _full_size(eqn):
  return any(math.prod(shaped(v).shape) == B * S * N for v in eqn.outvars)


def _roundings(jaxpr):
  """Full-size floor (stochastic rounding) or round (RTNE) ops: one per quantization of G'."""
  return [e for e in jaxpr_analysis.iter_eqns(jaxpr) if e.primitive.name in ("floor", "round") and _full_size(e)]


def _block_maxima(jaxpr, block):
  blocks = (math.ceil(B * S / block), math.ceil(N / block))
  return [
    e
    for e in jaxpr_analysis.iter_eqns(jaxpr)
    if e.primitive.name == "reduce_max" and shaped(e.outvars[0]).shape == blocks
  ]


def _code_roots(jaxpr):
  """For each f32 GEMM with a token dim and a [B*S, N]-sized operand (dX and dW), that operand traced
  back through reshapes and dtype conversions to the equation that made it."""
  made_by: dict[Any, Any] = {v: e for e in jaxpr_analysis.iter_eqns(jaxpr) for v in e.outvars}
  roots = []
  for e in jaxpr_analysis.iter_eqns(jaxpr):
    if e.primitive.name != "dot_general" or shaped(e.outvars[0]).dtype != jnp.float32:
      continue
    codes = [v for v in e.invars if math.prod(shaped(v).shape) == B * S * N]
    if len(codes) != 1:
      continue
    eqn = made_by.get(codes[0])
    while eqn is not None and eqn.primitive.name in ("reshape", "convert_element_type"):
      eqn = made_by.get(eqn.invars[0])
    roots.append(eqn)
  return roots


@pytest.mark.parametrize("fmt", UNIFORM)
@pytest.mark.parametrize("recipe", SHARED + SPLIT)
def test_uniform_formats_keep_three_int8_gemms_and_one_int8_quantization(recipe, fmt):
  jaxpr = _jaxpr(f"{recipe}@{fmt}")
  gemms = [d for d in jaxpr_analysis.int8_dots(jaxpr) if any(B * S in shaped(v).shape for v in d.invars)]
  assert len(gemms) == 3
  assert len(_roundings(jaxpr)) == (2 if recipe in SPLIT else 1)


@pytest.mark.parametrize("fmt", BLOCK_SCALED)
@pytest.mark.parametrize("recipe", SHARED + SPLIT)
def test_block_formats_round_the_gradient_once_and_feed_both_gemms_with_it(recipe, fmt):
  jaxpr = _jaxpr(f"{recipe}@{fmt}")
  quantizations = 2 if recipe in SPLIT else 1
  assert len(_roundings(jaxpr)) == quantizations
  f = FORMATS[fmt]
  assert isinstance(f, BlockScaledFormat)
  assert len(_block_maxima(jaxpr, f.block)) == quantizations  # square blocks: one set of scales each
  roots = _code_roots(jaxpr)
  assert len(roots) == 2 and all(r is not None for r in roots)  # dX and dW
  assert (roots[0] is roots[1]) == (recipe not in SPLIT)
  # the forward is still the one int8 GEMM
  assert len([d for d in jaxpr_analysis.int8_dots(jaxpr) if any(B * S in shaped(v).shape for v in d.invars)]) == 1


@pytest.mark.parametrize("recipe, words", [("s3r", math.ceil(B * S / 4)), ("s3r_ec_dx_bcast", math.ceil(B / 4))])
@pytest.mark.parametrize("fmt", [n for n in FORMATS if n != "int8"])
def test_every_format_draws_the_int8_recipes_compact_thresholds(recipe, words, fmt):
  assert jaxpr_analysis.random_words(_jaxpr(f"{recipe}@{fmt}")) == words


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("recipe", SHARED + SPLIT)
def test_fp8_formats_round_the_gradient_once_into_fp8_codes_that_feed_both_gemms(recipe, fmt):
  jaxpr = _jaxpr(f"{recipe}@{fmt}")
  quantizations = 2 if recipe in SPLIT else 1
  assert len(_roundings(jaxpr)) == quantizations
  casts = [
    e
    for e in jaxpr_analysis.iter_eqns(jaxpr)
    if e.primitive.name == "convert_element_type"
    and _full_size(e)
    and shaped(e.outvars[0]).dtype == FORMATS[fmt].code_dtype
  ]
  assert len(casts) == quantizations  # the codes are stored in the FP8 dtype
  roots = _code_roots(jaxpr)
  assert len(roots) == 2 and all(r is not None for r in roots)  # dX and dW
  assert (roots[0] is roots[1]) == (recipe not in SPLIT)
  assert len([d for d in jaxpr_analysis.int8_dots(jaxpr) if any(B * S in shaped(v).shape for v in d.invars)]) == 1
