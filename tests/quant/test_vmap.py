"""qmatmul under jax.vmap: one weight and one key make the mapped calls one batched call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis.jaxpr import shaped

V, S, K, N = 4, 6, 16, 8
KEY = jax.random.key(7)


def _operands():
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (V, S, K))
  w = jax.random.normal(kw, (K, N)) * 0.1
  g = jax.random.normal(kg, (V, S, N))
  return x, w, g


def _batched(recipe):
  return lambda x, w, g: jnp.sum(s3r.qmatmul(x, w, key=KEY, recipe=recipe) * g)


def _per_example(recipe):  # the Equinox idiom: each call sees one example's tokens [S, K]
  return lambda x, w, g: jnp.sum(jax.vmap(lambda xi: s3r.qmatmul(xi, w, key=KEY, recipe=recipe))(x) * g)


def _per_token(recipe):  # vmap over examples of a vmap over tokens: each call sees one token [K]
  one = lambda t, w: s3r.qmatmul(t, w, key=KEY, recipe=recipe)
  return lambda x, w, g: jnp.sum(jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(0, None))(x, w) * g)


def _grads(f, x, w, g):
  return jax.jit(jax.grad(f, argnums=(0, 1)))(x, w, g)


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "s3r", "s3r_ec_bcast", "int8_sr", "int8_rtne", "bf16"])
@pytest.mark.parametrize("mapped", [_per_example, _per_token], ids=["per_example", "per_token"])
def test_vmapped_calls_equal_the_batched_call_bit_for_bit(recipe, mapped):
  x, w, g = _operands()
  y_batched = s3r.qmatmul(x, w, key=KEY, recipe=recipe)
  y_mapped = jax.vmap(lambda xi: s3r.qmatmul(xi, w, key=KEY, recipe=recipe))(x)
  np.testing.assert_array_equal(np.asarray(y_mapped), np.asarray(y_batched))
  for a, b in zip(_grads(mapped(recipe), x, w, g), _grads(_batched(recipe), x, w, g)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mapped", [_per_example, _per_token], ids=["per_example", "per_token"])
def test_vmapped_gradient_has_the_int8_gemms_and_temp_memory_of_the_batched_call(mapped):
  x, w, g = _operands()
  recipe = "s3r_ec_dx"
  program = lambda f: jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w, g)
  # forward, dX, dW and the S3R-EC correction's small product: one each, not one per mapped index
  assert len(jaxpr_analysis.int8_dots(program(mapped(recipe)))) == 4
  assert len(jaxpr_analysis.int8_dots(program(_batched(recipe)))) == 4
  per_index_dw = [
    e for e in jaxpr_analysis.iter_eqns(program(mapped(recipe))) for v in e.outvars if shaped(v).shape == (V, K, N)
  ]
  assert not per_index_dw  # no weight-sized gradient per mapped index

  def temp(f):
    stats = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, w, g).compile().memory_analysis()
    assert stats is not None
    return stats.temp_size_in_bytes

  assert temp(mapped(recipe)) == temp(_batched(recipe))


def test_vmap_over_a_non_leading_axis_stacks_that_axis_first():
  x, w, g = _operands()
  xt = jnp.swapaxes(x, 0, 1)  # [S, V, K], mapped over axis 1
  f = lambda xt, w, g: jnp.sum(jax.vmap(lambda xi: s3r.qmatmul(xi, w, key=KEY), in_axes=1)(xt) * g)
  dxt, dw = _grads(f, xt, w, g)
  dx_ref, dw_ref = _grads(_batched("s3r_ec_dx"), x, w, g)
  np.testing.assert_array_equal(np.asarray(jnp.swapaxes(dxt, 0, 1)), np.asarray(dx_ref))
  np.testing.assert_array_equal(np.asarray(dw), np.asarray(dw_ref))


def test_per_example_gradients_under_vmap_of_grad_stay_per_example():
  x, w, g = _operands()
  one = lambda w, xi, gi: jnp.sum(s3r.qmatmul(xi, w, key=KEY) * gi)
  dw_each = jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0, 0)))(w, x, g)
  loop = np.stack([np.asarray(jax.jit(jax.grad(one))(w, x[i], g[i])) for i in range(V)])
  assert dw_each.shape == (V, K, N)
  np.testing.assert_allclose(np.asarray(dw_each), loop, rtol=1e-6, atol=1e-6)


def test_a_mapped_weight_runs_independent_matmuls_with_one_split_key_each():
  x, w, g = _operands()
  ws = jnp.stack([w, 2 * w, -w])
  keys = jax.random.split(KEY, 3)
  f = lambda ws: jnp.sum(jax.vmap(lambda wi: s3r.qmatmul(x, wi, key=KEY))(ws) * g)
  dws = jax.jit(jax.grad(f))(ws)
  loop = [jax.jit(jax.grad(lambda wi: jnp.sum(s3r.qmatmul(x, wi, key=keys[i]) * g)))(ws[i]) for i in range(3)]
  np.testing.assert_allclose(np.asarray(dws), np.stack([np.asarray(d) for d in loop]), rtol=1e-6, atol=1e-6)


def test_mapped_keys_keep_one_call_per_key():
  x, w, g = _operands()
  keys = jax.random.split(KEY, V)
  f = lambda x, w: jnp.sum(jax.vmap(lambda xi, k: s3r.qmatmul(xi, w, key=k))(x, keys) * g)
  dx, dw = jax.jit(jax.grad(f, argnums=(0, 1)))(x, w)
  one = lambda xi, w, k, gi: jnp.sum(s3r.qmatmul(xi, w, key=k) * gi)
  each = [jax.jit(jax.grad(one, argnums=(0, 1)))(x[i], w, keys[i], g[i]) for i in range(V)]
  np.testing.assert_allclose(np.asarray(dx), np.stack([np.asarray(d[0]) for d in each]), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(dw), sum(np.asarray(d[1]) for d in each), rtol=1e-5, atol=1e-5)


def test_forward_only_vmap_needs_no_key():
  x, w, _ = _operands()
  y = jax.jit(jax.vmap(lambda xi: s3r.qmatmul(xi, w)))(x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(s3r.qmatmul(x, w)))
