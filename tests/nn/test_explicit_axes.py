"""A one-device mesh with Explicit axes: qmatmul, grouped_qmatmul and the NNX adapters run and give
the numbers of the same program without a mesh. (An explicit mesh of one device already types every
array with its sharding, so a reshape merging a "sharded" dim or a dot over one raises
ShardingTypeError unless the quantizer handles it; 8 devices: tests/distributed/test_explicit_sharding.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from jax.sharding import reshard

import s3r
from tests.nn import minigpt

RECIPES = ("bf16", "s3r", "s3r_ec_dx", "int8_exact_bwd")


def _grads(fn, *args):
  return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1)))(*args)


@pytest.mark.parametrize("recipe", RECIPES)
def test_qmatmul_under_an_explicit_mesh_gives_the_unsharded_gradients(recipe):
  x = jax.random.normal(jax.random.key(0), (4, 8, 16))
  w = jax.random.normal(jax.random.key(1), (16, 8)) * 0.1
  fn = lambda x, w: s3r.qmatmul(x, w, key=jax.random.key(2), recipe=recipe)  # noqa: E731
  ref = _grads(fn, x, w)
  with jax.set_mesh(minigpt.explicit_mesh(1, 1)):
    xs, ws = reshard(x, P("batch", "model")), reshard(w, P(None, "model"))  # tokens and columns "sharded"
    got = _grads(fn, xs, ws)
    assert jax.typeof(fn(xs, ws)).sharding.spec == P("batch", "model", None)  # x already uses "model"
  for g, r in zip(got, ref):
    np.testing.assert_array_equal(g, r)
  assert got[1].sharding.spec == P(None, "model")


def test_grouped_qmatmul_under_an_explicit_mesh_gives_the_unsharded_gradients():
  x = jax.random.normal(jax.random.key(0), (24, 16))
  w = jax.random.normal(jax.random.key(1), (3, 16, 8)) * 0.1
  sizes = jnp.array([10, 0, 12], jnp.int32)
  fn = lambda x, w: s3r.grouped_qmatmul(x, w, sizes, key=jax.random.key(2), recipe="s3r")  # noqa: E731
  ref = _grads(fn, x, w)
  with jax.set_mesh(minigpt.explicit_mesh(1, 1)):
    got = _grads(fn, reshard(x, P("batch", "model")), reshard(w, P(None, "model", None)))  # K "sharded"
  for g, r in zip(got, ref):
    np.testing.assert_array_equal(g, r)


def _first_step(explicit: bool):
  model = minigpt.MiniGPT(rngs=nnx.Rngs(0))
  s3r.nn.quantize(model, "s3r_ec_dx", rngs=1)
  inputs, targets = minigpt.batch(4)
  if explicit:
    inputs, targets = reshard(inputs, minigpt.batch_spec()), reshard(targets, minigpt.batch_spec())
  loss, grads = nnx.jit(nnx.value_and_grad(minigpt.loss_fn))(model, inputs, targets)
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  optimizer.update(model, grads)
  return float(loss), jax.tree.map(np.asarray, nnx.to_pure_dict(grads))


def test_the_minigpt_fixture_quantized_under_an_explicit_mesh_matches_the_unsharded_model():
  """nnx.Linear and nnx.MultiHeadAttention projections (kernels with "model" sharding names) through
  s3r.nn.quantize: the same loss and gradients as the model built without a mesh."""
  with nnx.use_eager_sharding(False):  # without a mesh the sharding names are metadata only
    loss, grads = _first_step(explicit=False)
  with jax.set_mesh(minigpt.explicit_mesh(1, 1)):
    loss_e, grads_e = _first_step(explicit=True)
  assert loss_e == pytest.approx(loss, rel=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max()), grads_e, grads)
