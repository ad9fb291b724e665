"""Program structure of grouped_qmatmul from its jaxpr: three int8 grouped GEMMs per layer (plus
S3R-EC's one small per-expert factor product when correcting dX), ⌈rows/4⌉ random words for
`s3r`, one quantized gradient feeding both backward GEMMs, on both GEMM implementations."""

import math

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core

import s3r

T, K, N, E = 96, 40, 56, 3  # distinct sizes
INT8 = [n for n, r in s3r.RECIPES.items() if r.quantized_gradient]


def _eqns(jaxpr):
  """Every equation, nested jaxprs (custom_vjp, jit, cond) included."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
          yield from _eqns(sub)


def _int8_dots(jaxpr):
  """dot_general / ragged_dot_general equations with two int8 operands."""
  return [
    e
    for e in _eqns(jaxpr)
    if e.primitive.name in ("dot_general", "ragged_dot_general") and all(v.aval.dtype == jnp.int8 for v in e.invars[:2])
  ]


def _jaxpr(recipe, impl):
  def f(x, w, sizes, g, key):
    y, vjp = jax.vjp(lambda a, b: s3r.grouped_qmatmul(a, b, sizes, key=key, recipe=recipe, impl=impl), x, w)
    return y, vjp(g)

  return jax.make_jaxpr(f)(
    jnp.zeros((T, K), jnp.bfloat16),
    jnp.zeros((E, K, N)),
    jnp.zeros((E,), jnp.int32),
    jnp.zeros((T, N), jnp.bfloat16),
    jax.random.key(0),
  )


def _is_ec_product(dot):
  """S3R-EC's per-expert [E, 4, N] (3 digit rows of c_e and a row of ones) x Ŵ [E, K, N]."""
  return tuple(v.aval.shape for v in dot.invars[:2]) == ((E, 4, N), (E, K, N))


@pytest.mark.parametrize("impl", ["tiled", "ragged"])
@pytest.mark.parametrize("recipe", INT8)
def test_three_int8_grouped_gemms_plus_one_ec_factor_product_when_correcting_dx(recipe, impl):
  dots = _int8_dots(_jaxpr(recipe, impl))
  assert all(d.outvars[0].aval.dtype == jnp.int32 for d in dots)
  gemms = [d for d in dots if not _is_ec_product(d)]
  assert len(gemms) == 3
  if impl == "ragged":
    assert all(d.primitive.name == "ragged_dot_general" for d in gemms)
  assert len(dots) - len(gemms) == (1 if s3r.recipe(recipe).correct_dx else 0)


def test_bf16_recipe_has_no_int8_dot():
  assert _int8_dots(_jaxpr("bf16", "tiled")) == []


def _random_words(jaxpr):
  return sum(
    math.prod(e.params["shape"]) * e.params["bit_width"] // 32
    for e in _eqns(jaxpr)
    if e.primitive.name == "random_bits"
  )


@pytest.mark.parametrize(
  "recipe, words",
  [
    ("int8_rtne", 0),
    ("int8_sr", 2 * T * N),
    ("s3r", math.ceil(T / 4)),
    ("s3r_ec", math.ceil(T / 4)),
    ("s3r_bcast", math.ceil(E / 4)),  # one threshold per expert segment
    ("s3r_ec_dx_bcast", math.ceil(E / 4)),
    ("s3r_split_dx2d_dwbcast", math.ceil(T / 4) + math.ceil(E / 4)),
  ],
)
def test_random_words_drawn_per_recipe(recipe, words):
  assert _random_words(_jaxpr(recipe, "tiled")) == words


@pytest.mark.parametrize("recipe", INT8)
def test_upstream_gradient_is_quantized_once_and_feeds_both_backward_gemms(recipe):
  jaxpr = _jaxpr(recipe, "ragged")  # ragged_dot takes the codes as they are (no tile gather in between)
  quantizations = [
    e
    for e in _eqns(jaxpr)
    if e.primitive.name == "convert_element_type"
    and e.params["new_dtype"] == jnp.int8
    and math.prod(e.invars[0].aval.shape) == T * N
  ]
  assert len(quantizations) == (2 if s3r.recipe(recipe).split else 1)
  q_vars = {e.outvars[0] for e in quantizations}
  squeezed = {
    e.outvars[0] for e in _eqns(jaxpr) if e.primitive.name in ("reshape", "squeeze") and e.invars[0] in q_vars
  }
  consumers = [d for d in _int8_dots(jaxpr) if set(d.invars) & (q_vars | squeezed)]
  assert len(consumers) == 2
