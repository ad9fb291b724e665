"""Grid arithmetic shared by the number formats (formats/): square blocks, scale rounding and the
gaps of the non-uniform grids (E2M1 and the FP8 floating-point grids).

Dimension letters: T tokens (leading dims flattened), N channels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant.reductions import abs_max

E2M1_MAX = 6  # the largest E2M1 value
E4M3_MAX = 448  # the largest finite E4M3 value
# every positive finite E4M3 value, ascending (bit patterns 0x01..0x7e; 0x7f is NaN)
_E4M3_VALUES = np.arange(1, 127, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32)
_E8M0_EXPONENTS = (-126, 127)  # power-of-two scales kept to f32's normal range


def block_amax(v: jax.Array, block: int) -> jax.Array:
  """max |v| over the square `block` x `block` blocks of v [..., N] as [T, N] (leading dims flattened):
  [ceil(T/block), ceil(N/block)]; the last blocks are partial where `block` does not divide T or N."""
  a_TxN = v.reshape(-1, v.shape[-1]).astype(jnp.float32)
  rows, cols = a_TxN.shape
  tb, nb = -(-rows // block), -(-cols // block)
  a_TxN = jnp.pad(a_TxN, ((0, tb * block - rows), (0, nb * block - cols)))  # zeros: the max of the elements present
  return abs_max(a_TxN.reshape(tb, block, nb, block), axis=(1, 3))  # NaN for a block with a NaN or an Inf


def expand_blocks(s_blocks: jax.Array, shape: tuple[int, ...], block: int) -> jax.Array:
  """Each element's block scale, in `shape` ([..., N], leading dims flattened as in `block_amax`)."""
  tb, nb = s_blocks.shape
  s_TxN = jnp.broadcast_to(s_blocks[:, None, :, None], (tb, block, nb, block)).reshape(tb * block, nb * block)
  rows = int(np.prod(shape[:-1], dtype=np.int64))
  return s_TxN[:rows, : shape[-1]].reshape(shape)


def e4m3_ceil(x: jax.Array) -> jax.Array:
  """The smallest finite E4M3 value >= x (f32; 448 above 448, the smallest subnormal 2^-9 below it)."""
  table = jnp.asarray(_E4M3_VALUES)
  index = jnp.searchsorted(table, x, side="left", method="compare_all")
  return table[jnp.minimum(index, table.shape[0] - 1)]


def e8m0_ceil(x: jax.Array) -> jax.Array:
  """The smallest power of two >= x (f32), its exponent kept in [-126, 127]."""
  mantissa, exponent = jnp.frexp(x)  # x = mantissa · 2^exponent, mantissa in [0.5, 1)
  exponent = jnp.where(mantissa == 0.5, exponent - 1, exponent)  # x is itself a power of two
  return jnp.ldexp(jnp.float32(1), jnp.clip(exponent, *_E8M0_EXPONENTS))


def e2m1_gap(w: jax.Array) -> jax.Array:
  """The width hi - lo of the E2M1 grid gap [lo, hi) that holds w in [-6, 6]: 0.5 in [-2, 2), 1 in
  [-4, -2) and [2, 4), 2 in [-6, -4) and [4, 6] (at 6 the code is 6: w / 2 = 3 is an integer)."""
  return jnp.where((w >= -2) & (w < 2), 0.5, jnp.where((w >= -4) & (w < 4), 1.0, 2.0)).astype(jnp.float32)


def float_gap(w: jax.Array, mantissa_bits: int, min_exponent: int) -> jax.Array:
  """The width hi - lo of the gap [lo, hi) that holds w on a floating-point grid with `mantissa_bits`
  stored mantissa bits and smallest normal 2^`min_exponent` (f32, a power of two).

  For w in [2^e, 2^(e+1)) it is 2^(e - mantissa_bits), the spacing of that binade; for w in
  [-2^(e+1), -2^e) the same, so a negative power of two -2^e takes the finer spacing below it in
  magnitude (its gap [lo, hi) reaches towards zero). Below the smallest normal (subnormals and 0)
  the spacing is constant, 2^(min_exponent - mantissa_bits).
  """
  mantissa, exponent = jnp.frexp(jnp.abs(w))  # |w| = mantissa · 2^exponent, mantissa in [0.5, 1)
  e = exponent - 1  # |w| in [2^e, 2^(e+1))
  e = jnp.where((w < 0) & (mantissa == 0.5), e - 1, e)  # w = -2^e: the gap [-2^e, -2^e + spacing below 2^e)
  e = jnp.where(w == 0, min_exponent, jnp.maximum(e, min_exponent))
  return jnp.ldexp(jnp.float32(1), e - mantissa_bits)
