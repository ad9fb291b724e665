"""`compute_dtype` of the unquantized recipe: bf16 operands by default, f32 operands at full precision on
request (a float32 evaluation), in the dense and the grouped product; INT8 recipes ignore it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r

X = jax.random.normal(jax.random.key(0), (2, 5, 48), jnp.float32)
W = jax.random.normal(jax.random.key(1), (48, 24), jnp.float32)
EXACT = np.asarray(X, np.float64) @ np.asarray(W, np.float64)


def _rel(a, b) -> float:
  return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_float32_compute_multiplies_f32_operands_and_the_default_bf16_ones():
  assert _rel(s3r.qmatmul(X, W, recipe="bf16", compute_dtype=jnp.float32), EXACT) < 1e-6
  bf16 = s3r.qmatmul(X, W, recipe="bf16")
  assert _rel(bf16, EXACT) > 1e-4  # bf16 operands round at 2^-8
  assert np.array_equal(s3r.qmatmul(X, W, recipe="bf16", compute_dtype="bfloat16"), bf16)


def test_int8_recipes_ignore_the_compute_dtype():
  plain = s3r.qmatmul(X, W, recipe="int8_rtne")
  assert np.array_equal(s3r.qmatmul(X, W, recipe="int8_rtne", compute_dtype=jnp.float32), plain)


def test_float32_grouped_product_and_its_gradients_are_the_float64_ones():
  sizes = jnp.asarray([3, 0, 6], jnp.int32)
  x, w = X.reshape(10, 48), jnp.stack([W, 2 * W, -W])
  loss = lambda x, w, dt: jnp.sum(s3r.grouped_qmatmul(x, w, sizes, recipe="bf16", compute_dtype=dt) ** 2)
  expert = np.repeat([0, 2], [3, 6])
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  y64 = np.einsum("tk,tkn->tn", x64[:9], w64[expert])
  dx64 = np.einsum("tn,tkn->tk", 2 * y64, w64[expert])
  dx, _ = jax.grad(loss, argnums=(0, 1))(x, w, jnp.float32)
  assert _rel(dx[:9], dx64) < 1e-6 and not np.asarray(dx[9]).any()  # row 9 is past sum(group_sizes)
  dx_bf16, _ = jax.grad(loss, argnums=(0, 1))(x, w, None)
  assert _rel(dx_bf16[:9], dx64) > 1e-4


@pytest.mark.parametrize("fn", ["qmatmul", "grouped_qmatmul"])
def test_an_unsupported_compute_dtype_is_refused_naming_the_function(fn):
  with pytest.raises(ValueError, match=rf"{fn}: compute_dtype must be one of bfloat16, float32") as info:
    if fn == "qmatmul":
      s3r.qmatmul(X, W, recipe="bf16", compute_dtype=jnp.float16)
    else:
      s3r.grouped_qmatmul(X[0], W[None], jnp.asarray([5], jnp.int32), recipe="bf16", compute_dtype="int8")
  assert "\n" not in str(info.value)
