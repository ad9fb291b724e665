"""The unquantized `bf16` recipe's dense product: every GEMM on bf16 operands with f32 accumulation.

Forward Y = X W, backward dX = G Wᵀ and dW = Xᵀ G: each of the three GEMMs takes bf16 operands
(X, W and the upstream gradient G rounded to bf16 once) and accumulates in f32, as a bf16 dense
layer of Flax or MaxText computes them. Y and dX come out in x's dtype (the activation dtype),
dW in w's dtype (the f32 master weight's, as the INT8 recipes give it: the f32 accumulator is not
rounded to bf16 on the way). A custom VJP because autodiff of a bf16 product with an f32 result
transposes it with the f32 cotangent, so its backward GEMMs would take f32 operands.

Under tensor parallelism (`tp`), the GEMM that contracts the split dimension (the forward one for
a row split, dX for a column split) rounds each shard's partial product to x's dtype before the
cross-shard sum, as the INT8 recipes do (see tensor_parallel.py).

The backward is made of differentiable operations: a second derivative (grad of grad) goes
through it.

Dimension letters: T rows (tokens), K input features, N outputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import tensor_parallel
from s3r.quant.tensor_parallel import TensorParallel


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def bf16_matmul(
  x_TxK: jax.Array, w_KxN: jax.Array, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype
) -> jax.Array:
  """x @ w [T, N] in x's dtype: bf16 operands, f32 accumulation, forward and backward.

  `tp` is the tensor-parallel split (or None); `x_dtype` and `w_dtype` are the operands' dtypes
  (static): those of the output and dX, and of dW.
  """
  return _fwd(x_TxK, w_KxN, tp, x_dtype, w_dtype)[0]


def _product(a_MxC: jax.Array, b: jax.Array, tp: TensorParallel | None, split: bool, transposed: bool, dtype):
  """a @ b (or a @ bᵀ when `transposed`) with f32 accumulation in `dtype`; with `split`, each
  shard's partial product rounded to `dtype` before the cross-shard sum."""
  if split:
    identity = lambda acc: acc
    return tensor_parallel.split_contraction(a_MxC, b, tp, b_transposed=transposed, rescale=identity, dtype=dtype)
  return jnp.matmul(a_MxC, b.T if transposed else b, preferred_element_type=jnp.float32).astype(dtype)


def _fwd(
  x_TxK: jax.Array, w_KxN: jax.Array, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """(Y [T, N] in x's dtype, the bf16 operands (X, W) as residuals)."""
  del w_dtype
  xb_TxK, wb_KxN = x_TxK.astype(jnp.bfloat16), w_KxN.astype(jnp.bfloat16)
  split = tp is not None and tp.kind == "row"
  return _product(xb_TxK, wb_KxN, tp, split, False, x_dtype), (xb_TxK, wb_KxN)


def _bwd(
  tp: TensorParallel | None,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  res: tuple[jax.Array, jax.Array],
  g_TxN: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """(dX [T, K] in x's dtype, dW [K, N] in w's dtype), both from bf16 operands with f32 accumulation."""
  xb_TxK, wb_KxN = res
  gb_TxN = g_TxN.astype(jnp.bfloat16)  # lossless for bf16 activations, whose output gradient is bf16
  split = tp is not None and tp.kind == "column"
  dx_TxK = _product(gb_TxN, wb_KxN, tp, split, True, x_dtype)
  dw_KxN = jnp.matmul(xb_TxK.T, gb_TxN, preferred_element_type=jnp.float32).astype(w_dtype)
  return dx_TxK, dw_KxN


bf16_matmul.defvjp(_fwd, _bwd)
