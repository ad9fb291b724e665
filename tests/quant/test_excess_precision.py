"""The backward reads one value of an upstream gradient that the program computes in bf16.

XLA (`xla_allow_excess_precision`, on by default) may compute with the f32 value of a bf16
result instead of its rounding, in some of the operations that read it and not in others,
depending on fusion. The step Δ, the codes Q and the S3R-EC factors must all come from the same
G' (qmatmul builds them from one expression of G), or e = Q - G'/Δ is no longer the rounding
error of Q. This fails, for example, when the max for Δ or the means of e recompute G' from
their own copy of G (an `optimization_barrier` copy keeps XLA from merging the expressions).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r

B, S, K, N = 2, 64, 96, 160


def _grads(recipe, x, w, g, key):
  _, vjp = jax.vjp(lambda x, w: s3r.qmatmul(x, w, key=key, recipe=recipe), x, w)
  return vjp(g)


@pytest.mark.parametrize("tokens", [(B, S), (B * S,)], ids=["3d", "2d"])
@pytest.mark.parametrize("recipe", ["int8_rtne", "s3r", "s3r_ec_dx", "s3r_ec"])
def test_step_codes_and_ec_factors_come_from_one_value_of_a_gradient_computed_in_the_program(recipe, tokens):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((*tokens, K)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((K, N)) * 0.1, jnp.float32)
  a, b = (
    jnp.asarray(rng.standard_normal((*tokens, N)) * np.exp(rng.standard_normal((*tokens, N))), jnp.bfloat16)
    for _ in range(2)
  )
  key = jax.random.key(3)
  grads = jax.jit(_grads, static_argnums=0)

  in_program = jax.jit(lambda x, w, a, b: _grads(recipe, x, w, a * b, key))(x, w, a, b)
  # the two values XLA may read for G = a * b: its bf16 rounding, or the f32 product
  rounded = grads(recipe, x, w, jax.jit(jnp.multiply)(a, b), key)
  dx, dw = grads(recipe, x.astype(jnp.float32), w, a.astype(jnp.float32) * b.astype(jnp.float32), key)
  exact = (dx.astype(jnp.bfloat16), dw)
  assert not np.array_equal(rounded[1], exact[1])  # the two readings give different gradients here

  def same(u, v):
    return all(np.array_equal(np.asarray(p, np.float32), np.asarray(q, np.float32)) for p, q in zip(u, v))

  assert same(in_program, rounded) or same(in_program, exact)
