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

Dimension letters: K input features, N outputs (x is [..., K]: any leading token axes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import tensor_parallel
from s3r.quant.tensor_parallel import TensorParallel


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def bf16_matmul(x: jax.Array, w_KxN: jax.Array, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype):
  """x @ w [..., N] in x's dtype for x [..., K]: bf16 operands, f32 accumulation, forward and backward.

  `tp` is the tensor-parallel split (or None); `x_dtype` and `w_dtype` are the operands' dtypes
  (static): those of the output and dX, and of dW. x keeps its shape: the backward keeps x itself
  (bf16 activations) and no reshaped copy, so projections that share an input share that residual.
  """
  return _fwd(x, w_KxN, tp, x_dtype, w_dtype)[0]


def _product(a: jax.Array, b: jax.Array, tp: TensorParallel | None, split: bool, transposed: bool, dtype):
  """a [..., C] @ b (or @ bᵀ when `transposed`) with f32 accumulation in `dtype`; with `split`, each
  shard's partial product rounded to `dtype` before the cross-shard sum."""
  if split:
    identity = lambda acc: acc
    a_MxC = a.reshape(-1, a.shape[-1])
    assert tp is not None  # split implies a tensor-parallel split
    y = tensor_parallel.split_contraction(a_MxC, b, tp, b_transposed=transposed, rescale=identity, dtype=dtype)
    return y.reshape(a.shape[:-1] + y.shape[-1:])
  return jnp.matmul(a, b.T if transposed else b, preferred_element_type=jnp.float32).astype(dtype)


def _fwd(
  x: jax.Array, w_KxN: jax.Array, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """(Y [..., N] in x's dtype, the bf16 operands (X, W) as residuals)."""
  del w_dtype
  xb, wb_KxN = x.astype(jnp.bfloat16), w_KxN.astype(jnp.bfloat16)
  split = tp is not None and tp.kind == "row"
  return _product(xb, wb_KxN, tp, split, False, x_dtype), (xb, wb_KxN)


def _bwd(
  tp: TensorParallel | None,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  res: tuple[jax.Array, jax.Array],
  g: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """(dX [..., K] in x's dtype, dW [K, N] in w's dtype), both from bf16 operands with f32 accumulation."""
  xb, wb_KxN = res
  gb = g.astype(jnp.bfloat16)  # lossless for bf16 activations, whose output gradient is bf16
  split = tp is not None and tp.kind == "column"
  dx = _product(gb, wb_KxN, tp, split, True, x_dtype)
  xb_TxK, gb_TxN = xb.reshape(-1, xb.shape[-1]), gb.reshape(-1, gb.shape[-1])  # one GEMM over every token
  dw_KxN = jnp.matmul(xb_TxK.T, gb_TxN, preferred_element_type=jnp.float32)
  return dx, dw_KxN.astype(w_dtype)


bf16_matmul.defvjp(_fwd, _bwd)
