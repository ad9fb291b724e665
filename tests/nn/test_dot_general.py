"""Flax adapters: s3r's qmatmul as `dot_general` in Linen Dense and nnx.Linear, with key plumbing."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import s3r
import s3r.nn as snn
from labtools.analysis import jaxpr as inspect
from labtools.analysis.jaxpr import shaped

X = jax.random.normal(jax.random.key(0), (2, 8, 16), jnp.bfloat16)


def _linen_grads(model, variables, key):
  def loss(params):
    y = model.apply({"params": params}, X, rngs={"quant": key})
    return jnp.sum(y.astype(jnp.float32) ** 2)

  return jax.grad(loss)(variables["params"])


@pytest.mark.parametrize("style", ["dot_general_cls", "dot_general"])
def test_linen_dense_runs_the_quantized_matmul_keyed_by_the_quant_stream(style):
  kwargs: dict[str, Any] = (
    {"dot_general_cls": functools.partial(snn.LinenDotGeneral, recipe="s3r")}
    if style == "dot_general_cls"
    else {"dot_general": snn.LinenDotGeneral(recipe="s3r")}
  )
  model = nn.Dense(12, use_bias=False, dtype=jnp.bfloat16, **kwargs)
  variables = model.init({"params": jax.random.key(1)}, X)
  kernel = variables["params"]["kernel"]
  assert isinstance(kernel, jax.Array)
  y = model.apply(variables, X, rngs={"quant": jax.random.key(2)})
  np.testing.assert_array_equal(
    np.asarray(y, np.float32), np.asarray(s3r.qmatmul(X, kernel.astype(jnp.bfloat16), recipe="int8_rtne"), np.float32)
  )
  g_a = _linen_grads(model, variables, jax.random.key(3))["kernel"]
  g_b = _linen_grads(model, variables, jax.random.key(3))["kernel"]
  g_c = _linen_grads(model, variables, jax.random.key(4))["kernel"]
  np.testing.assert_array_equal(np.asarray(g_a), np.asarray(g_b))
  assert not np.array_equal(np.asarray(g_a), np.asarray(g_c))
  jaxpr = jax.make_jaxpr(lambda p: _linen_grads(model, {"params": p}, jax.random.key(0)))(variables["params"])
  assert len(inspect.int8_dots(jaxpr)) == 3


def test_linen_without_quant_rng_runs_forward_and_a_gradient_says_how_to_pass_it():
  model = nn.Dense(12, dot_general_cls=functools.partial(snn.LinenDotGeneral, recipe="s3r_ec_dx"))
  variables = model.init({"params": jax.random.key(1)}, X)
  y = jax.jit(model.apply)(variables, X)
  np.testing.assert_array_equal(
    np.asarray(y, np.float32), np.asarray(model.apply(variables, X, rngs={"quant": jax.random.key(0)}), np.float32)
  )
  loss = lambda p: jnp.sum(jnp.asarray(model.apply({"params": p}, X), jnp.float32))
  with pytest.raises(ValueError, match=r"rngs=\{'quant': step_key\} to apply"):
    jax.grad(loss)(variables["params"])


def test_nnx_linear_draws_a_fresh_key_per_call_reproducibly():
  def make():
    return nnx.Linear(
      16,
      12,
      use_bias=False,
      dtype=jnp.bfloat16,
      rngs=nnx.Rngs(0),
      dot_general=snn.NnxDotGeneral("s3r_ec_dx", rngs=nnx.Rngs(quant=7)),
    )

  @nnx.jit
  def grad_step(model):
    return nnx.grad(lambda m: jnp.sum(m(X).astype(jnp.float32) ** 2))(model)

  a, b = make(), make()
  a1, a2 = grad_step(a).kernel[...], grad_step(a).kernel[...]
  b1 = grad_step(b).kernel[...]
  assert not np.array_equal(np.asarray(a1), np.asarray(a2))  # the stream advanced between steps
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(b1))  # same seed, same first step
  jaxpr = jax.make_jaxpr(lambda: grad_step(make()))()
  dots = inspect.int8_dots(jaxpr)
  # forward, dX and dW GEMMs, plus S3R-EC's [3B + 1, N] x [K, N] factor product of the dX correction
  assert len(dots) == 4
  assert [shaped(d.invars[0]).shape for d in dots if shaped(d.invars[0]).shape[0] == 3 * X.shape[0] + 1] == [(7, 12)]


def test_pure_adapter_equals_qmatmul_with_the_same_key():
  w = jax.random.normal(jax.random.key(1), (16, 12)) * 0.1
  key = jax.random.key(5)
  dg = snn.dot_general("s3r_ec", key)
  f_a = lambda w: jnp.sum(dg(X, w, (((2,), (0,)), ((), ()))).astype(jnp.float32) ** 2)
  f_b = lambda w: jnp.sum(s3r.qmatmul(X, w, key=key, recipe="s3r_ec").astype(jnp.float32) ** 2)
  np.testing.assert_array_equal(np.asarray(jax.grad(f_a)(w)), np.asarray(jax.grad(f_b)(w)))


def test_rank_four_inputs_are_examples_of_flattened_tokens():
  w = jax.random.normal(jax.random.key(1), (16, 12)) * 0.1
  x4 = X.reshape(2, 2, 4, 16)
  key = jax.random.key(3)
  f4 = lambda w: jnp.sum(snn.dot_general("s3r_ec_bcast", key)(x4, w, (((3,), (0,)), ((), ()))).astype(jnp.float32) ** 2)
  f3 = lambda w: jnp.sum(s3r.qmatmul(X, w, key=key, recipe="s3r_ec_bcast").astype(jnp.float32) ** 2)
  np.testing.assert_array_equal(np.asarray(jax.grad(f4)(w)), np.asarray(jax.grad(f3)(w)))


def test_a_contraction_over_no_dimension_raises_naming_the_dimension_numbers():
  with pytest.raises(NotImplementedError, match=r"dimension_numbers=\(\(\(\), \(\)\), \(\(\), \(\)\)\).*not a matmul"):
    snn.dot_general("s3r", jax.random.key(0))(X, jnp.zeros((3,)), (((), ()), ((), ())))


def test_adapters_pass_the_tensor_parallel_split_through_to_qmatmul():
  """Without a mesh the split changes nothing; an unknown split is rejected by qmatmul itself,
  which shows the argument reaches it from all three adapters."""
  x = jax.random.normal(jax.random.key(0), (2, 8, 16), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (16, 32)) * 0.1
  dims = (((2,), (0,)), ((), ()))
  key = jax.random.key(2)
  plain = snn.dot_general("s3r", key)(x, w, dims)
  np.testing.assert_array_equal(snn.dot_general("s3r", key, tp="row")(x, w, dims), plain)
  with pytest.raises(ValueError, match="tp must be one of"):
    snn.dot_general("s3r", key, tp="diagonal")(x, w, dims)
  dense = nn.Dense(32, dot_general_cls=functools.partial(snn.LinenDotGeneral, recipe="s3r", tp="diagonal"))
  with pytest.raises(ValueError, match="tp must be one of"):
    dense.init({"params": jax.random.key(3), "quant": key}, x)
  lin = nnx.Linear(
    16, 32, rngs=nnx.Rngs(0), dot_general=snn.NnxDotGeneral("s3r", rngs=nnx.Rngs(quant=0), tp="diagonal")
  )
  with pytest.raises(ValueError, match="tp must be one of"):
    lin(x)
