"""The three grouped GEMMs of an expert layer, on rows sorted by expert (ragged-dot semantics).

Rows 0..T-1 of the left operand are sorted by expert: expert e owns the segment of
`group_sizes[e]` rows that starts at `sum(group_sizes[:e])`; rows past `sum(group_sizes)`
belong to no expert (dropless padding) and give zero rows / contribute nothing.

- `gmm(a_TxC, b_ExCxN)`:    out[t] = a[t] b[e(t)]               (forward: X̂ Ŵ_e)
- `gmm_nt(a_TxN, b_ExKxN)`: out[t] = a[t] b[e(t)]ᵀ              (dX: Q Ŵ_eᵀ)
- `tgmm(a_TxK, b_TxN)`:     out[e] = Σ_{t in segment e} a[t]ᵀ b[t]  (dW[e] = X̂_eᵀ Q_e)

Three implementations with the same results (int32 accumulators are exact, so bit for bit; GEMMs
on float codes accumulate in f32, where the paths may differ by the order of the f32 sums):
- "ragged": `jax.lax.ragged_dot(_general)`. Exact and zero-filling everywhere, but JAX and
  XLA's GPU rewriter expand it into a masked [E, T, C] operand: E times the routed work.
- "tiled": each segment is padded to a multiple of a tile of `tile` rows, so that every tile
  belongs to one expert; the tiles are gathered into [n_tiles, tile, C] (a static bound
  n_tiles = ceil(T / tile) + E) and a loop over the tiles in use multiplies each with its
  expert's weight, indexed inside the loop (no per-tile copy of the weights: a gathered
  [n_tiles, C, N] operand is about twice the size of all expert weights). Work: at most
  (T + E·tile) rows; `tile_rows` keeps E·tile ≤ T where it can.
- "pallas": the kernels of pallas.py on the unpadded rows, compiled through Triton on
  GPU and run in interpret mode on other platforms (for tests). They take int8 x int8 -> int32
  (the quantized recipes' codes) and bf16 x bf16 -> f32 at the default precision (the bf16
  recipe's forward, dX and dW: `_bf16_gemm`). Any other GEMM (f32 operands at full precision:
  the bf16 recipe's `compute_dtype=float32` and `int8_exact_bwd`'s backward; every GEMM on E4M3
  forward codes or FP8 gradient codes) runs its forward and dX on the tiled path and its dW on
  the ragged path on CUDA, the tiled path elsewhere. GEMMs on two FP8 code tensors keep their FP8 operands
  (`_float_codes`): compiled for an H100 they are Triton GEMM fusions with FP8 operands, or
  cuBLASLt FP8 matmuls with Triton GEMMs disabled, on the tiled and the ragged path
  (`python -m benchmarks aot --program moe`); XLA:CPU emulates them in f32.
- "auto" (grouped_qmatmul's default): the compiled Pallas kernels on GPU (CUDA), the tiled path
  elsewhere (bf16 GEMMs too); the other float GEMMs as under "pallas".

On a GPU (an H200) the compiled kernels and the ragged path agreed bit for bit in all three int32
GEMMs, and so did the tiled forward and dX; the tiled dW did not (`_tgmm_windows`, cause not
located: on the CPU all paths agree). Hence CUDA runs no tiled dW unless impl="tiled" is asked for.
The bf16 kernels are checked against ragged_dot in interpret mode (to the rounding of f32 sums) and
compiled for an H100 without one; no GPU run of them is recorded.

The `*_epilogue` functions add the dequantize epilogue of grouped_qmatmul (y = f32(acc) - sub,
· row scale, · (expert, column) scale, rows past the sum -> 0, cast): fused into the kernel on
the Pallas path, the same float ops in the same order after the GEMM on the others.

Dimension letters: T rows, E experts, K input features, N outputs, C a contracted dim,
P padded rows (n_tiles · tile), I tiles, L rows of a tile, M the output columns of a tile product.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from s3r.quant import formats
from s3r.quant.grouped import pallas

_CODES = formats.FORWARD_FORMAT.code_dtype  # the kernels' operand dtype (int8-stored codes)
_ACC = formats.accumulator(_CODES)  # and their accumulator (int32): the default `out` of the GEMMs
_BF16 = jnp.dtype(jnp.bfloat16)  # the kernels' float operand dtype (f32 accumulators)
IMPLS = ("auto", "pallas", "ragged", "tiled")
_KERNEL_IMPLS = ("auto", "pallas")
_MAX_TILE = 128
_MIN_TILE = 8


def tile_rows(rows: int, experts: int) -> int:
  """Rows per tile: the largest power of two ≤ rows/experts, clipped to [8, 128] (static)."""
  per = max(rows // max(experts, 1), 1)
  return min(_MAX_TILE, max(_MIN_TILE, 1 << (per.bit_length() - 1)))


class Layout(NamedTuple):
  """Where each row goes: segment ids, the tile padding and its inverse (all int32 arrays)."""

  group_sizes: jax.Array  # [E] sizes, sanitized (see `sanitize`)
  seg_T: jax.Array  # [T] expert of each row; E for rows past the sum (padding)
  src_P: jax.Array  # [P] source row of each padded slot; T (out of range, reads 0) for an empty slot
  dest_T: jax.Array  # [T] padded slot of each row; P (out of range, reads 0) for padding rows
  tile_expert: jax.Array  # [n_tiles] the expert whose weight each tile uses
  tile: int  # rows per tile (static)


def sanitize(group_sizes: jax.Array, rows: int) -> jax.Array:
  """Sizes as the GEMMs use them: negative sizes count as 0 and the segments are cut at `rows`.

  Concrete sizes are validated before (grouped_qmatmul raises on them); under a trace this
  keeps every implementation in bounds and in agreement with the others.
  """
  ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes.astype(jnp.int32), 0)), rows)
  return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


def layout(group_sizes: jax.Array, rows: int, tile: int | None = None) -> Layout:
  """The row bookkeeping of `rows` expert-sorted rows with (sanitized) `group_sizes`.

  `tile`: rows per tile, a positive int; None (the default) is `tile_rows(rows, experts)`. Any
  tile gives the same results; forcing one is for checks of the tiled path at other tile sizes.
  """
  experts = group_sizes.shape[0]
  if tile is None:
    tile = tile_rows(rows, experts)
  elif not isinstance(tile, int) or tile < 1:
    raise ValueError(f"layout: tile must be a positive int or None, got {tile!r}")
  n_tiles = math.ceil(rows / tile) + experts
  padded = n_tiles * tile
  gs = sanitize(group_sizes, rows)
  ends = jnp.cumsum(gs)
  starts = ends - gs
  tiles_E = (gs + tile - 1) // tile
  pend = jnp.cumsum(tiles_E) * tile
  pstart = pend - tiles_E * tile
  t = jnp.arange(rows, dtype=jnp.int32)
  seg_T = jnp.searchsorted(ends, t, side="right").astype(jnp.int32)
  seg_c = jnp.minimum(seg_T, experts - 1)
  dest_T = jnp.where(seg_T < experts, pstart[seg_c] + t - starts[seg_c], padded).astype(jnp.int32)
  p = jnp.arange(padded, dtype=jnp.int32)
  e_P = jnp.searchsorted(pend, p, side="right").astype(jnp.int32)
  e_c = jnp.minimum(e_P, experts - 1)
  j = p - pstart[e_c]
  src_P = jnp.where((e_P < experts) & (j < gs[e_c]), starts[e_c] + j, rows).astype(jnp.int32)
  return Layout(gs, seg_T, src_P, dest_T, e_c[::tile], tile)


def _tiles(a_TxC: jax.Array, lay: Layout) -> jax.Array:
  """[n_tiles, tile, C]: the rows in padded order, zeros in empty slots."""
  a_PxC = jnp.take(a_TxC, lay.src_P, axis=0, mode="fill", fill_value=0)
  return a_PxC.reshape(-1, lay.tile, a_TxC.shape[1])


def materialized_swap(a_BxMxN: jax.Array, nonnegative: jax.Array) -> jax.Array:
  """[B, N, M]: swapaxes(a, 1, 2) as a real copy that XLA:CPU cannot fold into the consuming dot.

  A folded transpose makes the dot contract the operand's middle (token) dimension, which
  XLA:CPU runs as a generic GEMM many times slower (see `numerics.materialized_transpose`,
  whose conditional trick this repeats; `nonnegative` is any runtime scalar >= 0). Other
  backends get the plain transpose.
  """

  def cpu(a):
    take = jnp.logical_not(nonnegative < 0)
    return lax.cond(take, lambda a: jnp.swapaxes(a, 1, 2), lambda a: jnp.zeros_like(jnp.swapaxes(a, 1, 2)), a)

  return lax.platform_dependent(a_BxMxN, cpu=cpu, default=lambda a: jnp.swapaxes(a, 1, 2))


def _untile(acc: jax.Array, lay: Layout) -> jax.Array:
  """[T, C] rows back in the original order, zeros for padding rows."""
  acc_PxC = acc.reshape(-1, acc.shape[-1])
  return jnp.take(acc_PxC, lay.dest_T, axis=0, mode="fill", fill_value=0)


def _ragged_dims(contract, lhs_ragged, rhs_group):
  return lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(contract, ((), ())), lhs_ragged_dimensions=lhs_ragged, rhs_group_dimensions=rhs_group
  )


def gmm(a_TxC: jax.Array, b_ExCxN: jax.Array, lay: Layout, impl: str, out=_ACC, precision=None) -> jax.Array:
  """out[t] = a[t] b[e(t)], [T, N] in `out` (zero rows past the sum)."""
  if impl in _KERNEL_IMPLS and _bf16_gemm(a_TxC, b_ExCxN, out, precision):
    return _bf16_rows(a_TxC, b_ExCxN, lay, impl, contract_last=False)
  impl = _float_fallback(impl, a_TxC, b_ExCxN, out, precision)
  if impl in _KERNEL_IMPLS:
    return gmm_epilogue(a_TxC, b_ExCxN, lay, impl, out=out)
  if impl == "ragged":
    return lax.ragged_dot(a_TxC, b_ExCxN, lay.group_sizes, preferred_element_type=out, precision=precision)
  return _untile(_tile_loop(_tiles(a_TxC, lay), b_ExCxN, 1, lay, out, precision), lay)


def gmm_nt(a_TxN: jax.Array, b_ExKxN: jax.Array, lay: Layout, impl: str, out=_ACC, precision=None) -> jax.Array:
  """out[t] = a[t] b[e(t)]ᵀ, [T, K] in `out` (zero rows past the sum)."""
  if impl in _KERNEL_IMPLS and _bf16_gemm(a_TxN, b_ExKxN, out, precision):
    return _bf16_rows(a_TxN, b_ExKxN, lay, impl, contract_last=True)
  impl = _float_fallback(impl, a_TxN, b_ExKxN, out, precision)
  if impl in _KERNEL_IMPLS:
    return gmm_nt_epilogue(a_TxN, b_ExKxN, lay, impl, out=out)
  if impl == "ragged":
    dims = _ragged_dims(((1,), (2,)), (0,), (0,))
    return lax.ragged_dot_general(
      a_TxN, b_ExKxN, lay.group_sizes, dims, precision=precision, preferred_element_type=out
    )
  return _untile(_tile_loop(_tiles(a_TxN, lay), b_ExKxN, 2, lay, out, precision), lay)


def _tile_loop(a_IxLxC, b_ExKxN, contract: int, lay: Layout, out, precision) -> jax.Array:
  """[n_tiles, tile, M]: tile i times its expert's weight, contracting b's dim `contract` (1 or 2).

  Only the Σ_e ⌈S_e/tile⌉ tiles in use are multiplied (a dynamic trip count; the rest stay 0),
  and b[e] is indexed inside the loop, so no [n_tiles, K, N] copy of the weights exists.
  """
  n_tiles, tile, _ = a_IxLxC.shape
  m = b_ExKxN.shape[3 - contract]
  used = jnp.sum((lay.group_sizes + tile - 1) // tile)

  def product(i, acc_IxLxM):
    b_KxN = lax.dynamic_index_in_dim(b_ExKxN, lay.tile_expert[i], axis=0, keepdims=False)
    a_LxC = lax.dynamic_index_in_dim(a_IxLxC, i, axis=0, keepdims=False)
    dims = (((1,), (contract - 1,)), ((), ()))
    prod_LxM = lax.dot_general(a_LxC, b_KxN, dims, precision=precision, preferred_element_type=out)
    return lax.dynamic_update_index_in_dim(acc_IxLxM, prod_LxM, i, axis=0)

  return lax.fori_loop(0, used, product, jnp.zeros((n_tiles, tile, m), out))


def tgmm(a_TxK: jax.Array, b_TxN: jax.Array, lay: Layout, impl: str, out=_ACC, precision=None) -> jax.Array:
  """out[e] = Σ_{t in segment e} a[t]ᵀ b[t], [E, K, N] in `out` (zero for an empty segment)."""
  if impl in _KERNEL_IMPLS and _bf16_gemm(a_TxK, b_TxN, out, precision):
    kernel = functools.partial(_tgmm_kernel, lay.group_sizes, out)
    return _dispatch(impl, kernel, lambda a, b: tgmm(a, b, lay, "tiled", out=out), a_TxK, b_TxN)
  if impl in _KERNEL_IMPLS and not _int8_codes(a_TxK, b_TxN, out, precision):
    return _float_tgmm(a_TxK, b_TxN, lay, out, precision)
  if impl in _KERNEL_IMPLS:
    return tgmm_epilogue(a_TxK, b_TxN, lay, impl, out=out)
  if impl == "ragged":
    dims = _ragged_dims(((0,), (0,)), (0,), ())
    return lax.ragged_dot_general(a_TxK, b_TxN, lay.group_sizes, dims, precision=precision, preferred_element_type=out)
  return _tgmm_windows(a_TxK, b_TxN, lay, out, precision)


def _tgmm_kernel(group_sizes, out, a_TxK, b_TxN, interpret):
  return pallas.tgmm(a_TxK, b_TxN, group_sizes, out=out, interpret=interpret)


def _float_tgmm(a_TxK, b_TxN, lay: Layout, out, precision) -> jax.Array:
  """A float dW under "auto" or "pallas" that no kernel takes (f32 at full precision, FP8 codes; not
  bf16, see `_bf16_gemm`): `ragged_dot_general` on CUDA (E times the work), where
  the tiled dW is not verified (an int32 check on a GPU found it differing from the Pallas kernel
  and from ragged_dot, which agreed), the tiled windows elsewhere. Only the branch of the platform
  compiled for is lowered, so other platforms run the tiled program unchanged."""

  def run(impl, a, b):
    return tgmm(a, b, lay, impl, out=out, precision=precision)

  ragged, tiled = functools.partial(run, "ragged"), functools.partial(run, "tiled")
  return lax.platform_dependent(a_TxK, b_TxN, cuda=ragged, default=tiled)


def _tgmm_windows(a_TxK, b_TxN, lay: Layout, out, precision) -> jax.Array:
  """dW[e] accumulated in place over windows of `tile` rows of each segment (a dynamic count).

  Window i covers rows off_i .. off_i + tile - 1 of segment e_i (rows past the segment's end
  are masked to zero), and adds X̂_winᵀ Q_win [K, N] into out[e_i]: every expert's product is
  written once per window of its own rows (Σ_e ⌈S_e/tile⌉ ≤ T/tile + E windows), not once per
  padded tile of a static bound, and X̂ is read from one token-contiguous copy X̂ᵀ [K, T].
  """
  rows, k = a_TxK.shape
  n, experts, width = b_TxN.shape[1], lay.group_sizes.shape[0], lay.tile
  gs = lay.group_sizes
  ends = jnp.cumsum(gs)
  wins_E = (gs + width - 1) // width
  wend_E = jnp.cumsum(wins_E)
  i = jnp.arange(math.ceil(rows / width) + experts, dtype=jnp.int32)
  e_W = jnp.minimum(jnp.searchsorted(wend_E, i, side="right"), experts - 1).astype(jnp.int32)
  off_W = (ends - gs)[e_W] + (i - (wend_E - wins_E)[e_W]) * width
  pad = ((0, width), (0, 0))  # a window starting near row T reads zeros, never a clamped slice
  at_KxT = jnp.pad(materialized_swap(a_TxK[None], gs[0])[0], ((0, 0), (0, width)))
  b_TxN = jnp.pad(b_TxN, pad)

  def add_window(j, acc_ExKxN):
    e, off = e_W[j], off_W[j]
    a_KxL = lax.dynamic_slice(at_KxT, (0, off), (k, width))
    b_LxN = lax.dynamic_slice(b_TxN, (off, 0), (width, n))
    in_L = off + jnp.arange(width) < ends[e]  # both operands masked: a NaN row of the other segment stays out
    a_KxL = jnp.where(in_L[None, :], a_KxL, jnp.zeros_like(a_KxL))
    b_LxN = jnp.where(in_L[:, None], b_LxN, jnp.zeros_like(b_LxN))
    prod = lax.dot_general(a_KxL, b_LxN, (((1,), (0,)), ((), ())), precision=precision, preferred_element_type=out)
    return lax.dynamic_update_index_in_dim(acc_ExKxN, acc_ExKxN[e] + prod, e, axis=0)

  return lax.fori_loop(0, wend_E[-1], add_window, jnp.zeros((experts, k, n), out))


# --- the dequantize epilogue, and the dispatch to the Pallas kernels ------------------------------


def _int8_codes(a: jax.Array, b: jax.Array, out, precision) -> bool:
  """Whether a GEMM is an int8 one the Pallas kernels take (with the fused epilogue): int8 x int8 -> int32
  at the default precision."""
  return a.dtype == _CODES and b.dtype == _CODES and jnp.dtype(out) == _ACC and precision is None


def _bf16_gemm(a: jax.Array, b: jax.Array, out, precision) -> bool:
  """Whether a float GEMM is one the Pallas kernels take: bf16 x bf16 -> f32 at the default precision
  (the bf16 recipe's three grouped GEMMs)."""
  return a.dtype == _BF16 and b.dtype == _BF16 and jnp.dtype(out) == jnp.float32 and precision is None


def _bf16_rows(a, b, lay: Layout, impl: str, contract_last: bool) -> jax.Array:
  """A bf16 forward (or dX, `contract_last`) GEMM with f32 results under "auto" or "pallas": the row
  kernel (see `_dispatch`), the tiled path where "auto" runs no kernel."""
  xla = lambda a, b: (gmm_nt if contract_last else gmm)(a, b, lay, "tiled", out=jnp.float32)  # noqa: E731

  def kernel(a, b, interpret):
    return pallas.gmm_rows(a, b, lay.group_sizes, contract_last=contract_last, out=jnp.float32, interpret=interpret)

  return _dispatch(impl, kernel, xla, a, b)


def _float_fallback(impl: str, a: jax.Array, b: jax.Array, out, precision) -> str:
  """A forward or dX GEMM that no kernel takes (neither int8 x int8 -> int32 nor bf16 x bf16 -> f32)
  takes the tiled path (such a float dW: see `_float_tgmm`)."""
  return "tiled" if impl in _KERNEL_IMPLS and not _int8_codes(a, b, out, precision) else impl


def _dispatch(impl: str, kernel, xla, *args):
  """The kernel compiled on CUDA and interpreted elsewhere for "pallas", compiled on CUDA and `xla`
  elsewhere for "auto", `xla` otherwise. Only the branch of the platform compiled for is lowered."""
  if impl not in _KERNEL_IMPLS:
    return xla(*args)
  compiled = functools.partial(kernel, interpret=False)
  other = functools.partial(kernel, interpret=True) if impl == "pallas" else xla
  return lax.platform_dependent(*args, cuda=compiled, default=other)


def _float_codes(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array, object, object]:
  """(a, b, accumulator, precision) of a GEMM on codes, the pairs of `formats.code_dot_general`:
  int8 x int8 as is (the kernels' int32 GEMM); FP8 x FP8 (E4M3 forward codes, FP8 gradient codes)
  as is with f32 results, a dot on the FP8 operands (that XLA:CPU emulates exactly in f32); any
  other pair (FP8 gradient codes times int8 forward codes, int8 gradient codes times E4M3 forward
  codes) as f32 operands at the highest precision, an exact f32 emulation. The last two run on the
  tiled or ragged path."""
  if _int8_codes(a, b, _ACC, None):
    return a, b, _ACC, None
  if a.dtype in formats.NATIVE_FP8_DTYPES and b.dtype in formats.NATIVE_FP8_DTYPES:
    return a, b, jnp.float32, None
  return a.astype(jnp.float32), b.astype(jnp.float32), jnp.float32, lax.Precision.HIGHEST


def _row_gemm_epilogue(a, b, lay, impl, contract_last, sub, row, col, out):
  experts = b.shape[0]
  if not _int8_codes(a, b, _ACC, None):  # float codes: no kernel takes them
    impl = "tiled" if impl in _KERNEL_IMPLS else impl
  xla_impl = "tiled" if impl in _KERNEL_IMPLS else impl

  def xla(a, b, sub, row, col):
    a, b, acc_type, precision = _float_codes(a, b)
    acc = (gmm_nt if contract_last else gmm)(a, b, lay, xla_impl, out=acc_type, precision=precision)
    col_rows = None if col is None else col[jnp.minimum(lay.seg_T, experts - 1)]
    row_col = None if row is None else row.reshape(-1, 1)
    return pallas.epilogue(acc, sub, row_col, col_rows, (lay.seg_T < experts)[:, None], out)

  def kernel(a, b, sub, row, col, interpret):
    return pallas.gmm_rows(
      a,
      b,
      lay.group_sizes,
      contract_last=contract_last,
      sub_TxD=sub,
      row_T=row,
      col_ExD=col,
      out=out,
      interpret=interpret,
    )

  return _dispatch(impl, kernel, xla, a, b, sub, row, col)


def gmm_epilogue(a_TxC, b_ExCxN, lay: Layout, impl: str, *, row_T=None, col_ExN=None, out=_ACC) -> jax.Array:
  """epilogue(a[t] b[e(t)]) with row scales row_T [T] and column scales col_ExN [E, N]: [T, N] in `out`."""
  return _row_gemm_epilogue(a_TxC, b_ExCxN, lay, impl, False, None, row_T, col_ExN, out)


def gmm_nt_epilogue(a_TxN, b_ExKxN, lay: Layout, impl: str, *, sub_TxK=None, row_T=None, out=_ACC) -> jax.Array:
  """epilogue(a[t] b[e(t)]ᵀ) with sub_TxK [T, K] subtracted and row scales row_T [T]: [T, K] in `out`."""
  return _row_gemm_epilogue(a_TxN, b_ExKxN, lay, impl, True, sub_TxK, row_T, None, out)


def tgmm_epilogue(a_TxK, b_TxN, lay: Layout, impl: str, *, sub_ExKxN=None, col_ExN=None, out=_ACC) -> jax.Array:
  """epilogue(Σ_{t in e} a[t]ᵀ b[t]) with sub_ExKxN subtracted and col_ExN [E, N] scales: [E, K, N] in `out`."""
  float_codes = not _int8_codes(a_TxK, b_TxN, _ACC, None)  # no kernel takes them: the float dW path
  xla_impl = impl if float_codes else "tiled" if impl in _KERNEL_IMPLS else impl

  def xla(a, b, sub, col):
    a, b, acc_type, precision = _float_codes(a, b)
    acc = tgmm(a, b, lay, xla_impl, out=acc_type, precision=precision)
    return pallas.epilogue(acc, sub, None, None if col is None else col[:, None, :], None, out)

  def kernel(a, b, sub, col, interpret):
    return pallas.tgmm(a, b, lay.group_sizes, sub_ExKxN=sub, col_ExN=col, out=out, interpret=interpret)

  if float_codes:
    return xla(a_TxK, b_TxN, sub_ExKxN, col_ExN)
  return _dispatch(impl, kernel, xla, a_TxK, b_TxN, sub_ExKxN, col_ExN)
