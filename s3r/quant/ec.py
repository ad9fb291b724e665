"""S3R-EC: subtract the structured part of the known rounding error (docs/algorithm.md §1).

The quantizer knows its rounding error exactly, in units of the step Δ:
e = Q - G'/Δ, shape [B, S, N]. Per example b its projection onto row-constant plus
column-constant matrices is  e_str = r 1ᵀ + 1 cᵀ - m 1 1ᵀ  with the token means r[b, s], the
channel means c[b, n] and the grand mean m[b]. Each function below returns what e_str
contributed to one product, in the units of that product's int32 accumulator, built from
small per-example factors only.

Dimension letters: B examples, S tokens per example, T = B*S, K input features, N outputs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Generator

import jax
import jax.numpy as jnp

from s3r.quant import formats, numerics

_UNROLL_MAX_EXAMPLES = 64  # up to this many examples (B of the traced, global batch) the dW update is unrolled
_FREE = jax.sharding.PartitionSpec.UNCONSTRAINED
_GATHER_FACTORS = contextvars.ContextVar("s3r_ec_gather_factors", default=True)

# The S3R-EC factors of a rounding error: token (row) means, channel (column) means, grand means.
Factors = tuple[jax.Array, jax.Array, jax.Array]


@contextlib.contextmanager
def gathered_factors(enabled: bool) -> Generator[None]:
  """Whether programs traced inside pin the S3R-EC factors and Ŵ to be gathered (default True).

  `gathered_factors(False)` is an ablation for measuring collectives (`python -m benchmarks comm`): XLA then
  places the factors itself. It acts at trace time: a function already traced and cached by
  `jax.jit` keeps the placement it was traced with.
  """
  token = _GATHER_FACTORS.set(bool(enabled))
  try:
    yield
  finally:
    _GATHER_FACTORS.reset(token)


def _unsharded_along(x: jax.Array, dim: int) -> jax.Array:
  """`x` with dimension `dim` whole on every device of the trace's mesh, the other dims free.

  Under data/FSDP sharding (inside `jax.sharding.use_abstract_mesh`, as `s3r train` traces
  its step) this all-gathers a small factor, or the int8 Ŵ, along that dimension before a
  product uses it. Without it XLA contracts the batch-sharded factors of the dW update into
  a weight-sized f32 partial sum that it then all-reduces (when B > _UNROLL_MAX_EXAMPLES),
  and gathers Ŵ for the dX update only after converting it to f32. A no-op without a mesh, and
  inside `gathered_factors(False)`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not _GATHER_FACTORS.get():
    return x
  spec = jax.sharding.PartitionSpec(*(None if d == dim else _FREE for d in range(x.ndim)))
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def error_factors(e_BxSxN: jax.Array) -> Factors:
  """Token means r [B, S], channel means c [B, N] and grand means m [B] of the error."""
  r_BxS = jnp.mean(e_BxSxN, axis=2)
  c_BxN = jnp.mean(e_BxSxN, axis=1)
  m_B = jnp.mean(r_BxS, axis=1)
  return r_BxS, c_BxN, m_B


# The dX correction needs Ŵ c_b, where Ŵ is int8 and c_b [N] a channel mean of the rounding
# error in units of Δ. As an f32 product, XLA first converts all of Ŵ to f32: a weight-sized
# copy (4x the int8 bytes) written and read on every backward pass; on XLA:CPU that copy and
# the f32 dot were most of the dX correction's time and of S3R-EC's extra temporary memory.
# Instead c_b is written as int8 digits and multiplied in the int8 GEMM path, reading Ŵ as is:
#   x = round(c · 2^20) = d0 + 128 d1 + 128² d2,   balanced base-128 digits, |d_j| ≤ 64.
# Precision: c is represented on a 2^-20 grid, so each channel mean is off by at most 2^-21
# (in units of Δ; a deterministic rounding far below the Δ/256 bias of the 7-bit thresholds),
# and |Ŵc - Ŵx/2^20| ≤ 2^-21 Σ_n |Ŵ_kn| ≤ 2^-21 · 127 N.
# Range: |e| ≤ 1 for every recipe on a uniform grid (floor(v + u) - v with u in (0, 1), or a code
# clipped to ±Q where |v| exceeds Q by float rounding only), so |c| ≤ 1, |x| ≤ 2^20 and every digit
# is in [-64, 64] (a 2^-21 grid would need a top digit of 128 at |c| = 1). Clipping c to
# [-1, 1] only guards that bound against a caller's out-of-range c.
# Overflow: the int32 sums are exact while N · 64 · 127 < 2^31, i.e. for N ≤ 2^18 (the dX GEMM
# itself, N · 127 · 127, overflows first, above N ≈ 133k). The three partial products are
# recombined in f32, rounding like the f32 dot they replace (2^-24 relative per operation).
_DIGIT_BITS = 7  # base 128
_DIGITS = 3
_FRACTION_BITS = 20  # c on a 2^-20 grid: |x| ≤ 2^20 = 128^2 · 64, so the top digit stays ≤ 64


def int8_digits(c_BxN: jax.Array) -> jax.Array:
  """Balanced base-128 int8 digits d [B, 3, N] of round(c · 2^20), for |c| ≤ 1 (c is clipped).

  Σ_j 128^j d[:, j] = round(c · 2^20) exactly; every digit is in [-64, 64]. A NaN c gives
  meaningless digits, but only with a non-finite step Δ, which makes qmatmul's dX non-finite.
  """
  base = float(1 << _DIGIT_BITS)
  x = jnp.round(jnp.clip(c_BxN.astype(jnp.float32), -1.0, 1.0) * float(1 << _FRACTION_BITS))  # exact integer
  digits = []
  for _ in range(_DIGITS - 1):
    high = jnp.round(x / base)  # exact: a power-of-two division, then round half to even
    digits.append(x - base * high)  # in [-64, 64]
    x = high
  digits.append(x)  # |x| ≤ round(round(2^20 / 128) / 128) = 64
  return jnp.stack(digits, axis=-2).astype(jnp.int8)


def from_int8_digits(acc_Bx3xK: jax.Array) -> jax.Array:
  """Σ_j 128^j acc[:, j] / 2^20 in f32 [B, K]: the value of a product of `int8_digits` (int32)."""
  acc = acc_Bx3xK.astype(jnp.float32)
  base = float(1 << _DIGIT_BITS)
  total = acc[:, _DIGITS - 1]
  for j in range(_DIGITS - 2, -1, -1):  # Horner: (acc2 · 128 + acc1) · 128 + acc0
    total = total * base + acc[:, j]
  return total * (1.0 / (1 << _FRACTION_BITS))


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def dx_correction(
  r_BxS: jax.Array, c_BxN: jax.Array, m_B: jax.Array, wq_KxN: jax.Array, fmt: formats.Format = formats.INT8
) -> jax.Array:
  """e_str Ŵᵀ per example: (r - m) rowsum(Ŵ)ᵀ + 1 (Ŵ c)ᵀ, shape [B, S, K] (f32).

  Only rowsum(Ŵ) [K] and Ŵ c_b [B, K] are products; the rest is a broadcast that XLA
  fuses into the rescale of the dX accumulator. `fmt` is the format of the gradient codes: for
  one without integer codes (block-scaled FP4, FP8), whose error in units of Δ is not bounded by 1,
  the products are f32 emulations; with E4M3 weight codes Ŵ (an FP8 forward) one bf16 GEMM
  (`_float_weight_dx_correction`); otherwise they read Ŵ as int8 (below).
  """
  # N whole: under FSDP the int8 Ŵ is gathered along N (as the dX GEMM's own operand is).
  wq_KxN = _unsharded_along(wq_KxN, 1)
  if not jnp.issubdtype(wq_KxN.dtype, jnp.integer):
    return _float_weight_dx_correction(r_BxS, c_BxN, m_B, wq_KxN)
  if not fmt.capabilities.integer_codes:
    hi = jax.lax.Precision.HIGHEST
    w_KxN = wq_KxN.astype(jnp.float32)
    wc_BxK = jnp.einsum("bn,kn->bk", c_BxN.astype(jnp.float32), w_KxN, precision=hi)
    return _centered(r_BxS, m_B)[:, :, None] * jnp.sum(w_KxN, axis=1) + wc_BxK[:, None, :]
  batch, n = c_BxN.shape
  # One small int8 dot gives Ŵ c_b (from c's int8 digits, see above) and rowsum(Ŵ) = Ŵ 1;
  # as reductions, XLA:CPU fuses them into the elementwise rescale of the [T, K] dX
  # accumulator and recomputes an N-long sum for every one of its elements (a GEMM's worth
  # of extra work). Rows: digit j of example b at 3b + j (example-major, as c is sharded),
  # then one row of ones.
  digits_RxN = int8_digits(c_BxN).reshape(_DIGITS * batch, n)
  lhs_RxN = jnp.concatenate([digits_RxN, jnp.ones((1, n), digits_RxN.dtype)])
  acc_RxK = numerics.code_matmul_nt(lhs_RxN, wq_KxN)  # [3B + 1, K] int32, exact
  wc_BxK = from_int8_digits(acc_RxK[:-1].reshape(batch, _DIGITS, -1))
  rowsum_K = acc_RxK[-1].astype(jnp.float32)  # exact in f32 while 127 N < 2^24
  return _centered(r_BxS, m_B)[:, :, None] * rowsum_K + wc_BxK[:, None, :]


def _centered(r_BxS: jax.Array, m_B: jax.Array) -> jax.Array:
  """r - m [B, S]: each example's token means less their mean (m = mean(r, axis=1), from `error_factors`).

  m passes an optimization barrier (an identity) on its way to the subtraction. Without it, r, its
  row mean and the subtraction form the "softmax" pattern that XLA:GPU's Triton softmax rewriter
  turns into a Triton fusion; priority fusion then grows that fusion into the rescale of the dX
  accumulator (and the sum of every dX that shares the layer input), searching Triton tilings at
  every step: most of the GPU compile time of an S3R-EC layer (docs/performance-gpu.md, "Where the INT8
  compile time goes"). The values are the same bit for bit.
  """
  return r_BxS - jax.lax.optimization_barrier(m_B)[:, None]


def _float_weight_dx_correction(r_BxS: jax.Array, c_BxN: jax.Array, m_B: jax.Array, wq_KxN: jax.Array) -> jax.Array:
  """`dx_correction` for float weight codes Ŵ (E4M3, exact in bf16): c is split exactly into three bf16
  parts, c = c0 + c1 + c2 (8 significant bits each; f32 has 24), and one bf16 GEMM with f32 results
  gives Ŵ c_j (every product exact in f32) and rowsum(Ŵ) = Ŵ 1, reading Ŵ in bf16 instead of a
  weight-sized f32 copy; the three parts are summed in f32, as an f32 dot's partial sums are."""
  batch, n = c_BxN.shape
  lhs_RxN = jnp.concatenate([bf16_parts(c_BxN).reshape(3 * batch, n), jnp.ones((1, n), jnp.bfloat16)])
  acc_RxK = jax.lax.dot_general(
    lhs_RxN, wq_KxN.astype(jnp.bfloat16), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )
  wc_BxK = jnp.sum(acc_RxK[:-1].reshape(batch, 3, -1), axis=1)
  return _centered(r_BxS, m_B)[:, :, None] * acc_RxK[-1] + wc_BxK[:, None, :]


def bf16_parts(c_BxN: jax.Array) -> jax.Array:
  """[B, 3, N] bf16: c = c0 + c1 + c2 exactly (f32 c; 8 significant bits per part, f32 has 24)."""
  parts, rest = [], c_BxN.astype(jnp.float32)
  for _ in range(3):
    part = rest.astype(jnp.bfloat16)
    parts.append(part)
    rest = rest - part.astype(jnp.float32)  # exact: the rounding error of a bf16 rounding
  return jnp.stack(parts, axis=1)


@jax.named_scope("s3r_ec")  # names its kernels in profiles and the performance model
def dw_correction(r_BxS: jax.Array, c_BxN: jax.Array, m_B: jax.Array, xqT_KxT: jax.Array) -> jax.Array:
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
