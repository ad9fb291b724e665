"""INT8 numerics: absmax scales, round-to-nearest-even codes and the int8 GEMMs.

Dimension letters: T tokens (B*S flattened), K input features, N output features.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

QMAX = 127  # codes live in [-127, 127]: the int8 range made symmetric
INV_QMAX = np.float32(1.0 / QMAX)  # f32 reciprocal of 127


def absmax_scale(x: jax.Array, axis: int) -> jax.Array:
  """s = max |x| / 127 along `axis` (f32); an all-zero slice gets scale 1, never 0.

  Computed as max|x| * f32(1/127): XLA rewrites a division by the constant 127 into that
  multiplication anyway (within 1 ulp of the true quotient), so we write it explicitly and
  references can match the result bit for bit. A slice whose max is below 127 times the
  smallest normal f32 (~1.5e-36) gets a subnormal scale, which XLA:CPU flushes to zero, so it
  takes the zero-slice path and quantizes to all-zero codes.
  """
  amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis)
  scale = amax * INV_QMAX
  return jnp.where(scale == 0, jnp.ones_like(scale), scale)


def quantize_rtne(x: jax.Array, scale: jax.Array) -> jax.Array:
  """int8 codes RTNE(x * (1/scale)), clipped to [-127, 127]; `scale` broadcasts against x.

  Multiplies by the f32 reciprocal of the scale, never divides: XLA rewrites a division by a
  broadcast scale into that multiplication in some fusions and not in others, and the two
  differ by an ulp. bf16 inputs hit exact ties often (x = max/2 gives 63.5 with the
  reciprocal but 63.499996 with the division), so a division let the forward GEMM and the
  saved X̂ᵀ of the same program, or two device meshes, round a tie differently.
  """
  v = x.astype(jnp.float32) * reciprocal(scale)
  return jnp.clip(jnp.round(v), -QMAX, QMAX).astype(jnp.int8)


def gradient_step(amax: jax.Array) -> jax.Array:
  """The backward's per-tensor step Δ = max|G'| · f32(1/127) from `amax` = max|G'| (already
  reduced over every shard); an all-zero gradient gets Δ = 1, never 0."""
  delta = amax * INV_QMAX
  return jnp.where(delta == 0, jnp.ones_like(delta), delta)


def round_codes(v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
  """int8 codes of v = G'/Δ, clipped to [-127, 127]: RTNE(v) without a threshold, else the
  stochastic rounding floor(v + u) with `threshold` u (broadcast against v)."""
  rounded = jnp.round(v) if threshold is None else jnp.floor(v + threshold)
  return jnp.clip(rounded, -QMAX, QMAX).astype(jnp.int8)


def reciprocal(a: jax.Array) -> jax.Array:
  """1/a in f32, computed once per scale (see quantize_rtne)."""
  return jnp.float32(1) / a.astype(jnp.float32)


def int8_matmul(a_MxC: jax.Array, b_CxN: jax.Array) -> jax.Array:
  """int8 x int8 -> int32 product in the canonical layout (contract a's last, b's first dim).

  XLA:CPU runs this layout several times faster than one that contracts a leading
  dimension, so every caller passes operands already laid out this way.
  """
  return lax.dot_general(a_MxC, b_CxN, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def int8_matmul_nt(a_MxC: jax.Array, b_NxC: jax.Array) -> jax.Array:
  """int8 x int8 -> int32 product a @ b.T (contracts the last dim of both; also a fast layout)."""
  return lax.dot_general(a_MxC, b_NxC, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)


def materialized_transpose(a_MxN: jax.Array, nonnegative: jax.Array) -> jax.Array:
  """a.T as a real row-major copy that XLA:CPU cannot fold back into the consuming dot.

  XLA's simplifier sinks a plain transpose into the dot_general that consumes it, turning
  X̂ᵀ Q into a dot that contracts X̂'s leading (token) dimension; XLA:CPU then upcasts the
  int8 operands to int32 and runs a generic GEMM about 15x slower. On CPU, a conditional on
  a runtime value (`nonnegative`, any scalar >= 0 or NaN, e.g. a scale) is opaque to that
  rewrite (`optimization_barrier` is not: XLA:CPU expands it early). Both branches have the
  same shape; the second is never taken. Other backends get the plain transpose (their
  GEMMs take either layout, and a conditional would cost a device-to-host sync on GPU).
  """

  def cpu(a):
    take = jnp.logical_not(nonnegative < 0)  # true for every scale, NaN included
    return lax.cond(take, lambda a: a.T, lambda a: jnp.zeros_like(a.T), a)

  return lax.platform_dependent(a_MxN, cpu=cpu, default=lambda a: a.T)
