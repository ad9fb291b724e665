"""S3R-EC: subtract the structured part of the known rounding error (ALGORITHM.md §1).

The quantizer knows its rounding error exactly, in units of the step Δ:
e = Q - G'/Δ, shape [B, S, N]. Per example b its projection onto row-constant plus
column-constant matrices is  e_str = r 1ᵀ + 1 cᵀ - m 1 1ᵀ  with the token means r[b, s], the
channel means c[b, n] and the grand mean m[b]. Each function below returns what e_str
contributed to one product, in the units of that product's int32 accumulator, built from
small per-example factors only.

Dimension letters: B examples, S tokens per example, T = B*S, K input features, N outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_UNROLL_MAX_EXAMPLES = 64  # up to this many examples (B of the traced, global batch) the dW update is unrolled
_FREE = jax.sharding.PartitionSpec.UNCONSTRAINED


def _unsharded_along(x: jax.Array, dim: int) -> jax.Array:
  """`x` with dimension `dim` whole on every device of the trace's mesh, the other dims free.

  Under data/FSDP sharding (inside `jax.sharding.use_abstract_mesh`, as `s3r train` traces
  its step) this all-gathers a small factor, or the int8 Ŵ, along that dimension before a
  product uses it. Without it XLA contracts the batch-sharded factors of the dW update into
  a weight-sized f32 partial sum that it then all-reduces (when B > _UNROLL_MAX_EXAMPLES),
  and gathers Ŵ for the dX update only after converting it to f32. A no-op without a mesh.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return x
  spec = jax.sharding.PartitionSpec(*(None if d == dim else _FREE for d in range(x.ndim)))
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


def error_factors(e_BxSxN: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Token means r [B, S], channel means c [B, N] and grand means m [B] of the error."""
  r_BxS = jnp.mean(e_BxSxN, axis=2)
  c_BxN = jnp.mean(e_BxSxN, axis=1)
  m_B = jnp.mean(r_BxS, axis=1)
  return r_BxS, c_BxN, m_B


def dx_correction(r_BxS, c_BxN, m_B, wq_KxN: jax.Array) -> jax.Array:
  """e_str Ŵᵀ per example: (r - m) rowsum(Ŵ)ᵀ + 1 (Ŵ c)ᵀ, shape [B, S, K] (f32).

  Only rowsum(Ŵ) [K] and Ŵ c_b [B, K] are products; the rest is a broadcast that XLA
  fuses into the rescale of the dX accumulator.
  """
  # N whole: under FSDP the int8 Ŵ is gathered along N (as the dX GEMM's own operand is),
  # not converted to f32 first and gathered 4x larger.
  wq_KxN = _unsharded_along(wq_KxN, 1)
  # One small dot gives Ŵ c_b and rowsum(Ŵ) = Ŵ 1; dots are computed once. Written as reductions, XLA:CPU fuses
  # them into the elementwise rescale of the [T, K] dX accumulator and recomputes an
  # N-long sum for every one of its elements (a GEMM's worth of extra work).
  c1_Bp1xN = jnp.concatenate([c_BxN, jnp.ones((1, c_BxN.shape[1]), c_BxN.dtype)])  # [c_b; 1]
  wc1_Bp1xK = jax.lax.dot_general(c1_Bp1xN, wq_KxN.astype(jnp.float32), (((1,), (1,)), ((), ())))
  wc_BxK, rowsum_K = wc1_Bp1xK[:-1], wc1_Bp1xK[-1]
  return (r_BxS - m_B[:, None])[:, :, None] * rowsum_K + wc_BxK[:, None, :]


def dw_correction(r_BxS, c_BxN, m_B, xqT_KxT: jax.Array) -> jax.Array:
  """Σ_b X̂_bᵀ e_str_b, shape [K, N] (f32): a rank-(B+1) update from per-example factors.

  Σ_b X̂_bᵀ e_str_b = Σ_b (p_b - S m_b x̄_b) 1ᵀ + S Σ_b x̄_b c_bᵀ with p_b = X̂_bᵀ r_b and
  x̄_b the token mean of X̂_b. Only x̄ [K, B] and c [B, N] are gathered under data
  parallelism (and a [K] column term all-reduced), never a weight-sized partial.
  """
  batch, seq = r_BxS.shape
  xq_KxBxS = xqT_KxT.reshape(xqT_KxT.shape[0], batch, seq).astype(jnp.float32)
  p_KxB = jnp.einsum("kbs,bs->kb", xq_KxBxS, r_BxS)
  xbar_KxB = jnp.mean(xq_KxBxS, axis=2)
  col_K = jnp.sum(p_KxB - seq * m_B * xbar_KxB, axis=1)
  xbar_KxB, c_BxN = _unsharded_along(xbar_KxB, 1), _unsharded_along(c_BxN, 0)
  if batch <= _UNROLL_MAX_EXAMPLES:
    # A sum of B outer products (not a dot): XLA fuses it into the rescale of the int32 dW
    # accumulator, so no weight-sized f32 temporary exists besides dW itself. As a dot, XLA
    # would first write the accumulator out as f32 to use it as the GEMM's addend.
    rank_b_KxN = sum(xbar_KxB[:, b, None] * c_BxN[None, b, :] for b in range(batch))
  else:  # keeps the traced program small; costs one [K, N] f32 temporary
    rank_b_KxN = jnp.einsum("kb,bn->kn", xbar_KxB, c_BxN)
  return col_K[:, None] + seq * rank_b_KxN
