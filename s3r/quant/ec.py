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

_UNROLL_MAX_EXAMPLES = 64  # up to this many examples per device the dW update is unrolled


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
  w_KxN = wq_KxN.astype(jnp.float32)
  rowsum_K = jnp.sum(w_KxN, axis=1)
  wc_BxK = jnp.einsum("kn,bn->bk", w_KxN, c_BxN)
  return (r_BxS - m_B[:, None])[:, :, None] * rowsum_K + wc_BxK[:, None, :]


def dw_correction(r_BxS, c_BxN, m_B, xqT_KxT: jax.Array) -> jax.Array:
  """Σ_b X̂_bᵀ e_str_b, shape [K, N] (f32): a rank-(B+1) update from per-example factors.

  Σ_b X̂_bᵀ e_str_b = Σ_b (p_b - S m_b x̄_b) 1ᵀ + S Σ_b x̄_b c_bᵀ with p_b = X̂_bᵀ r_b and
  x̄_b the token mean of X̂_b. Only p [K, B], x̄ [K, B] and c [B, N] are gathered under data
  parallelism, never a weight-sized partial.
  """
  batch, seq = r_BxS.shape
  xq_KxBxS = xqT_KxT.reshape(xqT_KxT.shape[0], batch, seq).astype(jnp.float32)
  p_KxB = jnp.einsum("kbs,bs->kb", xq_KxBxS, r_BxS)
  xbar_KxB = jnp.mean(xq_KxBxS, axis=2)
  col_K = jnp.sum(p_KxB - seq * m_B * xbar_KxB, axis=1)
  if batch <= _UNROLL_MAX_EXAMPLES:
    # A sum of B outer products (not a dot): XLA fuses it into the rescale of the int32 dW
    # accumulator, so no weight-sized f32 temporary exists besides dW itself. As a dot, XLA
    # would first write the accumulator out as f32 to use it as the GEMM's addend.
    rank_b_KxN = sum(xbar_KxB[:, b, None] * c_BxN[None, b, :] for b in range(batch))
  else:  # keeps the traced program small; costs one [K, N] f32 temporary
    rank_b_KxN = jnp.einsum("kb,bn->kn", xbar_KxB, c_BxN)
  return col_K[:, None] + seq * rank_b_KxN
