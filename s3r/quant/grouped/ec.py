"""S3R-EC over expert-sorted rows: the dense formulas of quant/ec.py with "example" = one expert's segment.

The rounding error in units of Δ is e = Q - G'/Δ, shape [T, N]; rows past the sum of the
group sizes have e = 0 and belong to no segment. For segment e (its S_e rows, the rows
whose products dW[e] sums) the projection onto row-constant plus column-constant matrices is
  e_str[t] = r[t] 1ᵀ + c_e - m_e 1ᵀ   for t in segment e,
with r[t] = mean_n e[t, n] (row means), c_e = mean_{t in e} e[t, :] (column means over the
segment) and m_e = mean_{t in e} r[t] (the segment mean). An empty segment has no rows and
no factors (they are set to 0). See docs/moe.md for the derivation of the two corrections.

Dimension letters: T rows, E experts (segments), K input features, N outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from s3r.quant import ec, formats


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def segment_factors(e_TxN: jax.Array, seg_T: jax.Array, group_sizes: jax.Array) -> ec.Factors:
  """Row means r [T], segment column means c [E, N] and segment means m [E] of the error."""
  experts = group_sizes.shape[0]
  count_E = jnp.maximum(group_sizes, 1).astype(jnp.float32)  # an empty segment's sums are 0
  r_T = jnp.mean(e_TxN, axis=1)

  def seg_mean(a: jax.Array) -> jax.Array:
    total = jax.ops.segment_sum(a, seg_T, num_segments=experts + 1, indices_are_sorted=True)[:experts]
    return total / count_E.reshape((experts,) + (1,) * (a.ndim - 1))

  return r_T, seg_mean(e_TxN), seg_mean(r_T)


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def dx_correction(
  r_T: jax.Array,
  c_ExN: jax.Array,
  m_E: jax.Array,
  wq_ExKxN: jax.Array,
  seg_T: jax.Array,
  fmt: formats.Format = formats.INT8,
) -> jax.Array:
  """e_str[t] Ŵ_{e(t)}ᵀ = (r[t] - m_e) rowsum(Ŵ_e) + Ŵ_e c_e for every row, [T, K] (f32).

  Rows past the sum get 0. The per-expert products rowsum(Ŵ_e) and Ŵ_e c_e [E, K] come from
  one small batched int8 dot of c_e's int8 digits (ec.int8_digits) and a row of ones with Ŵ_e,
  so Ŵ is read as int8, as in the dense correction. For gradient codes `fmt` without integer codes
  (FP8), whose error in units of Δ is not bounded by 1, the products are f32 emulations, as in
  the dense correction; with E4M3 weight codes (an FP8 forward) one batched bf16 GEMM of c_e's three
  exact bf16 parts (`ec.bf16_parts`) and a row of ones, as the dense `ec.dx_correction` does.
  """
  experts, n = c_ExN.shape
  if not jnp.issubdtype(wq_ExKxN.dtype, jnp.integer):  # E4M3 weight codes: the dense layer's bf16 GEMM
    lhs_Ex4xN = jnp.concatenate([ec.bf16_parts(c_ExN), jnp.ones((experts, 1, n), jnp.bfloat16)], axis=1)
    dims = (((2,), (2,)), ((0,), (0,)))
    acc_Ex4xK = lax.dot_general(lhs_Ex4xN, wq_ExKxN.astype(jnp.bfloat16), dims, preferred_element_type=jnp.float32)
    wc_ExK = jnp.sum(acc_Ex4xK[:, :3], axis=1)
    rowsum_ExK = acc_Ex4xK[:, 3]
  elif fmt.capabilities.integer_codes:
    digits_Ex3xN = ec.int8_digits(c_ExN)
    lhs_Ex4xN = jnp.concatenate([digits_Ex3xN, jnp.ones((experts, 1, n), digits_Ex3xN.dtype)], axis=1)
    dims = (((2,), (2,)), ((0,), (0,)))
    acc_Ex4xK = lax.dot_general(lhs_Ex4xN, wq_ExKxN, dims, preferred_element_type=formats.accumulator(wq_ExKxN.dtype))
    wc_ExK = ec.from_int8_digits(acc_Ex4xK[:, :3])
    rowsum_ExK = acc_Ex4xK[:, 3].astype(jnp.float32)
  else:
    w_ExKxN = wq_ExKxN.astype(jnp.float32)
    hi = lax.Precision.HIGHEST
    wc_ExK = jnp.einsum("en,ekn->ek", c_ExN.astype(jnp.float32), w_ExKxN, precision=hi)
    rowsum_ExK = jnp.sum(w_ExKxN, axis=2)
  valid_T = seg_T < experts
  seg_c = jnp.minimum(seg_T, experts - 1)
  corr_TxK = (r_T - m_E[seg_c])[:, None] * rowsum_ExK[seg_c] + wc_ExK[seg_c]
  return jnp.where(valid_T[:, None], corr_TxK, 0.0)


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def dw_correction(r_T: jax.Array, c_ExN: jax.Array, m_E: jax.Array, xq_TxK: jax.Array, seg_T: jax.Array) -> jax.Array:
  """Σ_{t in e} X̂[t]ᵀ e_str[t] per expert, [E, K, N] (f32): a rank-2 update of each dW[e].

  = (p_e - m_e σ_e) 1ᵀ + σ_e c_eᵀ with p_e = Σ_{t in e} X̂[t] r[t] and σ_e = Σ_{t in e} X̂[t]
  (σ_e = S_e x̄_e in the dense notation).
  """
  experts = c_ExN.shape[0]
  xq_TxK = xq_TxK.astype(jnp.float32)
  seg_sum = lambda a: jax.ops.segment_sum(a, seg_T, num_segments=experts + 1, indices_are_sorted=True)[:experts]
  p_ExK = seg_sum(xq_TxK * r_T[:, None])
  sigma_ExK = seg_sum(xq_TxK)
  col_ExK = p_ExK - m_E[:, None] * sigma_ExK
  return col_ExK[:, :, None] + sigma_ExK[:, :, None] * c_ExN[:, None, :]
