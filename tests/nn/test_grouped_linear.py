"""GroupedLinear: grouped_qmatmul behind an NNX layer that draws a fresh key per call."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

import s3r
from s3r.nn import GroupedLinear

SIZES = jnp.asarray([4, 0, 5], jnp.int32)


def test_layer_equals_grouped_qmatmul_and_draws_a_new_key_per_call():
  layer = GroupedLinear(8, 6, 3, recipe="s3r", rngs=nnx.Rngs(params=0, quant=1))
  x = jnp.asarray(np.random.default_rng(0).standard_normal((10, 8)), jnp.float32)
  loss = lambda m: jnp.sum(m(x, SIZES) ** 2)
  g1, g2 = nnx.grad(loss)(layer)["kernel"][...], nnx.grad(loss)(layer)["kernel"][...]
  assert not np.array_equal(g1, g2)  # a fresh key each call
  np.testing.assert_array_equal(layer(x, SIZES), s3r.grouped_qmatmul(x, layer.kernel[...], SIZES, recipe="int8_rtne"))
  assert layer.kernel.get_metadata()["logical_axes"] == ("expert", "embed", "mlp")
  assert (np.asarray(g1)[1] == 0).all()  # the empty expert
