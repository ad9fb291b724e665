"""General contractions through the adapters equal the flattened qmatmul (first lhs axis = examples)."""

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import s3r
import s3r.nn as snn

B, S, D, H, DH = 2, 4, 8, 2, 3
X = jax.random.normal(jax.random.key(0), (B, S, D))
KEY = jax.random.key(9)
RECIPE = "s3r_ec_bcast"  # per-example thresholds and per-example S3R-EC means: sensitive to what an example is


def _np(a):
  return np.asarray(a, np.float32)


def _out(y) -> jax.Array:
  """The output of a Linen `apply` that returns no mutated collections."""
  assert isinstance(y, jax.Array)
  return y


def test_dense_general_multi_head_projection_equals_the_reshaped_qmatmul():
  layer = nn.DenseGeneral(features=(H, DH), use_bias=False, dot_general=snn.dot_general(RECIPE, KEY))
  kernel = layer.init(jax.random.key(1), X)["params"]["kernel"]
  assert isinstance(kernel, jax.Array) and kernel.shape == (D, H, DH)
  g = jax.random.normal(jax.random.key(2), (B, S, H, DH))
  y, vjp = jax.vjp(lambda x, k: layer.apply({"params": {"kernel": k}}, x), X, kernel)
  y_ref, vjp_ref = jax.vjp(lambda x, w: s3r.qmatmul(x, w, key=KEY, recipe=RECIPE), X, kernel.reshape(D, H * DH))
  np.testing.assert_array_equal(_np(y), _np(y_ref).reshape(B, S, H, DH))
  (dx, dk), (dx_ref, dw_ref) = vjp(g), vjp_ref(g.reshape(B, S, H * DH))
  np.testing.assert_array_equal(_np(dx), _np(dx_ref))
  np.testing.assert_array_equal(_np(dk), _np(dw_ref).reshape(D, H, DH))


def test_output_projection_over_two_axes_equals_the_reshaped_qmatmul():
  xh = X.reshape(B, S, H, D // H)
  layer = nn.DenseGeneral(features=D, axis=(-2, -1), use_bias=False, dot_general=snn.dot_general(RECIPE, KEY))
  kernel = layer.init(jax.random.key(1), xh)["params"]["kernel"]
  assert isinstance(kernel, jax.Array)
  grad = jax.grad(lambda k: jnp.sum(_out(layer.apply({"params": {"kernel": k}}, xh)) ** 3))(kernel)
  grad_ref = jax.grad(lambda w: jnp.sum(s3r.qmatmul(X, w, key=KEY, recipe=RECIPE) ** 3))(kernel.reshape(D, D))
  np.testing.assert_array_equal(_np(grad), _np(grad_ref).reshape(kernel.shape))


def test_permuted_contraction_equals_qmatmul_of_the_transposed_operands():
  """Contracting lhs dims (2, 1) with rhs dims (1, 0): K is flattened in the given pairing order."""
  x = jax.random.normal(jax.random.key(3), (B, H, DH, S))  # free dims 0 and 3, contract (2, 1)
  w = jax.random.normal(jax.random.key(4), (H, DH, 5))  # contract (1, 0) pairs DH with DH and H with H
  dims = (((2, 1), (1, 0)), ((), ()))
  y = snn.dot_general(RECIPE, KEY)(x, w, dims)
  ref = s3r.qmatmul(
    x.transpose(0, 3, 2, 1).reshape(B, S, DH * H), w.transpose(1, 0, 2).reshape(DH * H, 5), key=KEY, recipe=RECIPE
  )
  np.testing.assert_array_equal(_np(y), _np(ref))
  np.testing.assert_allclose(_np(y), _np(jax.lax.dot_general(x, w, dims)), rtol=0.1, atol=0.1)


def test_batch_dims_are_a_vmap_with_one_key_per_batch_index():
  e = 3
  x = jax.random.normal(jax.random.key(3), (S, e, D))  # batch dim 1
  w = jax.random.normal(jax.random.key(4), (e, D, 5))  # batch dim 0
  dims = (((2,), (1,)), ((1,), (0,)))
  f = lambda w: jnp.sum(snn.dot_general(RECIPE, KEY)(x, w, dims) ** 2)
  keys = jax.random.split(KEY, e)
  ref = lambda w: sum(jnp.sum(s3r.qmatmul(x[:, i], w[i], key=keys[i], recipe=RECIPE) ** 2) for i in range(e))
  y = snn.dot_general(RECIPE, KEY)(x, w, dims)
  assert y.shape == (e, S, 5)
  np.testing.assert_array_equal(_np(jax.grad(f)(w)), _np(jax.grad(ref)(w)))


def test_nnx_linear_general_and_einsum_equal_the_reshaped_qmatmul_forward():
  rngs = nnx.Rngs(params=0, quant=1)
  lg = nnx.LinearGeneral(D, (H, DH), use_bias=False, rngs=rngs, dot_general=snn.NnxDotGeneral(RECIPE, rngs=rngs))
  ein = snn.quantize(nnx.Einsum("bsd,dhk->bhsk", (D, H, DH), rngs=rngs), RECIPE)
  layers: list[tuple[nnx.LinearGeneral | nnx.Einsum, Callable]] = [
    (lg, lambda y: y),
    (ein, lambda y: y.transpose(0, 2, 1, 3)),
  ]
  for layer, y_of in layers:
    kernel = layer.kernel[...]
    ref = s3r.qmatmul(X, kernel.reshape(D, H * DH), recipe=RECIPE).reshape(B, S, H, DH)
    np.testing.assert_array_equal(_np(y_of(layer(X))), _np(ref))


def test_einsum_helper_matches_jnp_einsum_layouts():
  x = jax.random.normal(jax.random.key(3), (B, S, D))
  w = jax.random.normal(jax.random.key(4), (3, D, 5))
  exact = lambda a, b, dims: jax.lax.dot_general(a, b, dims)
  for eq in ("bsd,edf->ebsf", "bsd,edf->bsef", "bsd,edf->fsbe"):
    np.testing.assert_allclose(snn.einsum(eq, x, w, exact), jnp.einsum(eq, x, w), rtol=1e-6, atol=1e-6)
  xb = jax.random.normal(jax.random.key(5), (3, S, D))
  np.testing.assert_allclose(
    snn.einsum("esd,edf->esf", xb, w, exact), jnp.einsum("esd,edf->esf", xb, w), rtol=1e-6, atol=1e-6
  )
