"""The E4M3 forward (`Recipe.forward_format`, `NAME+fwd_e4m3`): its codes, its error against the exact product
and the bf16 recipe, bounded from E4M3's relative precision, and the recipes that refuse it.

E4M3 (float8_e4m3fn) has 3 stored mantissa bits and smallest normal 2^-6: rounding a value v in [-448, 448] to
nearest changes it by at most 2^-4 |v| (half the relative spacing 2^-3 of a binade) or, below 2^-6, by half the
subnormal spacing 2^-9. With the per-token scale s_x = max|x|/448 (and per-channel s_w), each element is off by
at most a_k = 2^-4 |x_k| + 2^-10 s_x (b_k likewise for w), so |y - x w| <= sum_k a_k |w_k| + |x_k| b_k + a_k b_k.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r.quant import formats
from tests.quant.reference import Reference, heavy_tailed

REL = 2.0**-4  # E4M3's largest relative rounding error (to nearest)
SUB = 2.0**-10  # half its subnormal spacing, in units of the scale
BF16_REL = 2.0**-8  # bf16's (8 significant bits)


def _problem(rng, b=2, s=24, k=96, n=40):
  x = (rng.standard_normal((b, s, k)) * np.exp(rng.standard_normal((b, s, 1)))).astype(np.float32)
  w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
  w[:, 0] = 0.0  # an all-zero channel: scale 1, codes 0
  return x, w


def _bound(x, w, rel_x, abs_x, rel_w, abs_w):
  """sum_k (a_k |w_k| + |x_k| b_k + a_k b_k) for per-element errors a = rel_x |x| + abs_x, b = rel_w |w| + abs_w."""
  ax, aw = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
  a, b = rel_x * ax + abs_x, rel_w * aw + abs_w
  return a @ aw + ax @ b + a @ b


def test_the_e4m3_forward_is_within_the_bound_from_e4m3_rounding(rng):
  x, w = _problem(rng)
  ref = Reference(x, w, np.zeros(x.shape[:-1] + (w.shape[1],), np.float32), forward="e4m3")
  y = np.asarray(s3r.qmatmul(jnp.asarray(x), jnp.asarray(w), recipe="s3r_ec_dx@e5m2+fwd_e4m3"), np.float64)
  exact = x.astype(np.float64) @ w.astype(np.float64)
  bound = _bound(x, w, REL, SUB * ref.sx[..., None], REL, SUB * ref.sw[None, :])
  slack = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w))  # the f32 accumulation and rescale
  assert (np.abs(y - exact) <= bound + slack).all()
  # the executed graph: E4M3 codes (the reference's, independent of the library) times their scales
  np.testing.assert_allclose(y, ref.y, rtol=1e-5, atol=1e-6 * np.abs(ref.y).max())
  # not vacuous: E4M3 is visibly coarser than int8 on the same problem (max rel. error 2^-4 vs about 2^-8)
  y_int8 = np.asarray(s3r.qmatmul(jnp.asarray(x), jnp.asarray(w), recipe="s3r_ec_dx"), np.float64)
  assert np.linalg.norm(y - exact) > 2 * np.linalg.norm(y_int8 - exact)


def test_the_e4m3_forward_is_within_the_two_formats_bounds_of_the_bf16_recipe(rng):
  x, w = _problem(rng)
  ref = Reference(x, w, np.zeros(x.shape[:-1] + (w.shape[1],), np.float32), forward="e4m3")
  y = np.asarray(s3r.qmatmul(jnp.asarray(x), jnp.asarray(w), recipe="s3r@e4m3+fwd_e4m3"), np.float64)
  y_bf16 = np.asarray(s3r.qmatmul(jnp.asarray(x), jnp.asarray(w), recipe="bf16"), np.float64)
  e4m3 = _bound(x, w, REL, SUB * ref.sx[..., None], REL, SUB * ref.sw[None, :])
  bf16 = _bound(x, w, BF16_REL, 0.0, BF16_REL, 0.0)
  slack = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w))
  assert (np.abs(y - y_bf16) <= e4m3 + bf16 + 2 * slack).all()


def test_every_quantized_recipe_takes_the_e4m3_forward_by_name():
  for name, base in s3r.RECIPES.items():
    if not base.quantized:
      with pytest.raises(ValueError, match="does not quantize the forward"):
        s3r.recipe(f"{name}+fwd_e4m3")
      continue
    r = s3r.recipe(f"{name}+fwd_e4m3")
    assert r.forward_format == "e4m3" and r.name == f"{name}+fwd_e4m3" and r.grad_format == base.grad_format
  r = s3r.recipe("s3r_ec_dx@e5m2+fwd_e4m3")
  assert (r.grad_format, r.forward_format, r.correct_dx) == ("e5m2", "e4m3", True)
  assert s3r.recipe("s3r+fwd_int8") is s3r.RECIPES["s3r"]
  with pytest.raises(ValueError, match="unknown forward format 'e5m2'"):
    s3r.recipe("s3r+fwd_e5m2")
  assert formats.FORWARD_FORMATS == ("int8", "e4m3")


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
  """The operand dtypes of every dot_general in a jaxpr and the jaxprs it calls."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      found.append(tuple(str(v.aval.dtype) for v in eqn.invars[:2]))
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += _dot_operand_dtypes(inner)
  return found


def test_the_e4m3_forward_codes_reach_the_gemms_as_fp8_operands():
  # the forward GEMM and both backward GEMMs take float8 operands (the form XLA:GPU runs natively)
  x, w = jnp.ones((1, 32, 64), jnp.float32), jnp.ones((64, 48), jnp.float32)
  f = lambda x, w: jnp.sum(s3r.qmatmul(x, w, key=jax.random.key(0), recipe="s3r@e5m2+fwd_e4m3"))
  dots = _dot_operand_dtypes(jax.make_jaxpr(jax.grad(f, (0, 1)))(x, w).jaxpr)
  assert sorted(dots) == sorted(
    [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2")]
  )


def test_a_heavy_tailed_activation_keeps_its_small_tokens_on_the_e4m3_grid(rng):
  # per-token scales: a token 10^4 times smaller than another is quantized on its own scale
  x = heavy_tailed(rng, (1, 8, 32), decades=4)
  x[0, 0] *= 1e-4
  w = (rng.standard_normal((32, 16)) * 0.1).astype(np.float32)
  y = np.asarray(s3r.qmatmul(jnp.asarray(x), jnp.asarray(w), recipe="int8_rtne+fwd_e4m3"), np.float64)
  exact = x.astype(np.float64) @ w
  ref = Reference(x, w, np.zeros((1, 8, 16), np.float32), forward="e4m3")
  bound = _bound(x, w, REL, SUB * ref.sx[..., None], REL, SUB * ref.sw[None, :])
  assert (np.abs(y - exact)[0, 0] <= bound[0, 0] + 1e-6 * np.abs(exact[0, 0]).max()).all()
  assert np.abs(exact[0, 0]).max() > 0
