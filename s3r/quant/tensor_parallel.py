"""Tensor-parallel partial sums rounded per shard, as in the paper's TPU runs.

Under Megatron-style tensor parallelism one GEMM of each projection contracts a dimension
that is split over the `tensor` mesh axis: the forward GEMM of a row-parallel projection
(o, down: W split along K) and the dX GEMM of a column-parallel one (q, k, v, gate, up: W
split along N). Left to itself, the SPMD partitioner all-reduces that GEMM's int32
accumulator: exact, and bitwise independent of the tensor-parallel degree t. The paper
instead rounds each shard's GEMM output to bf16 and reduces bf16 partial sums (2 bytes per
element instead of 4). `split_contraction` writes that explicitly: the contraction is cut
into t slices, the batched int8 GEMM yields t int32 partial products [t, M, N] with t
sharded over the mesh axis, each is rescaled and rounded to the output dtype, and the t
rounded partials are summed in that dtype (one all-reduce in the output dtype).

The rounding then depends on t (as it does in the paper): the result is a function of the
mesh shape, not only of the inputs. XLA:CPU performs any bf16 all-reduce in f32 (the values
are bf16-rounded all the same); GPU and TPU reduce in bf16.

Dimension letters: t shards, M rows, C the contracted dimension, N columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import DTypeLike

from s3r.quant import formats

_FREE = jax.sharding.PartitionSpec.UNCONSTRAINED
KINDS = ("row", "column")  # which dimension of W [K, N] the tensor axis splits: K (row) or N (column)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorParallel:
  """Static description of one projection's tensor-parallel split (hashable: a custom-VJP argument)."""

  kind: str  # "row": W split along K, the forward GEMM has partial sums; "column": split along N, dX has them
  axis: str  # mesh axis name of the split
  shards: int  # t, the size of that axis in the traced mesh (> 1)


def resolve(kind: str | None, axis: str, contracted: int) -> TensorParallel | None:
  """The split to apply, or None: no kind, no mesh in the trace, the axis absent or of size 1,
  or a contracted dimension it does not divide (the sharding rules then leave W replicated)."""
  if kind is None:
    return None
  if kind not in KINDS:
    raise ValueError(f"qmatmul: tp must be one of {KINDS} or None, got {kind!r}")
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or axis not in mesh.axis_names:
    return None
  shards = mesh.shape[axis]
  if shards == 1 or contracted % shards:
    return None
  return TensorParallel(kind=kind, axis=axis, shards=shards)


def split_contraction(
  a_MxC: jax.Array,
  b: jax.Array,
  tp: TensorParallel,
  *,
  b_transposed: bool,
  rescale: Callable[[jax.Array], jax.Array],
  dtype: DTypeLike,
) -> jax.Array:
  """Σ_t dtype(rescale(a[:, C_t] b[C_t, :])) summed in `dtype`: [M, N].

  `b` is [C, N], or [N, C] when `b_transposed` (the layout of `numerics.code_matmul_nt`);
  `rescale` maps an f32 [M, N] partial product to its real values (broadcasting scales).
  Code operands accumulate in their format's accumulator (int8 in int32), float operands in f32.
  """
  t = tp.shards
  m, c = a_MxC.shape
  a_MxtxC = a_MxC.reshape(m, t, c // t)
  if b_transposed:
    b_ = b.reshape(b.shape[0], t, c // t)  # [N, t, C/t]
    dims = (((2,), (2,)), ((1,), (1,)))
  else:
    b_ = b.reshape(t, c // t, b.shape[1])  # [t, C/t, N]
    dims = (((2,), (1,)), ((1,), (0,)))
  acc_type = formats.accumulator(a_MxC.dtype)
  acc_txMxN = lax.dot_general(a_MxtxC, b_, dims, preferred_element_type=acc_type)
  mesh = jax.sharding.get_abstract_mesh()
  spec = jax.sharding.PartitionSpec(tp.axis, _FREE, _FREE)
  acc_txMxN = lax.with_sharding_constraint(acc_txMxN, jax.sharding.NamedSharding(mesh, spec))
  part_txMxN = rescale(acc_txMxN.astype(jnp.float32)).astype(dtype)
  # lax.reduce, not jnp.sum: jnp.sum would upcast bf16 to f32 for the sum (and the all-reduce).
  return lax.reduce(part_txMxN, np.array(0, dtype), lax.add, (0,))
