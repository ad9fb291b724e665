"""Pallas kernels of the three grouped GEMMs, with the dequantize epilogue fused.

Two operand types: int8 x int8 with int32 accumulation (the quantized recipes' codes) and
bf16 x bf16 with f32 accumulation (the `bf16` recipe's unquantized products; no epilogue).

Rows 0..T-1 are sorted by expert (ragged-dot semantics, see gemm.py): expert e owns
rows starts[e] .. ends[e] - 1; rows past ends[E-1] belong to no expert.

- `gmm_rows(a_TxC, b, sizes)`: out[t] = a[t] b[e(t)] (forward, b = Ŵ [E, K, N]) or
  a[t] b[e(t)]ᵀ (dX, b = Ŵ [E, K, N] contracted on N: `contract_last=True`). Grid (row tile m,
  column block j). Each program loops over the experts whose segments meet its tile (a
  precomputed tile -> (first, last) expert table), computes the tile's product with that
  expert's weight block (an inner loop over the contracted dim), applies the
  epilogue and keeps it for the rows of that segment (a select: rows of one tile are disjoint
  between experts, so no output block is written by two programs and nothing is summed in
  float). Rows past the sum are set to zero explicitly.
- `tgmm(a_TxK, b_TxN, sizes)`: out[e] = Σ_{t in segment e} a[t]ᵀ b[t] (dW). Grid (expert e,
  row block i, column block j); each program loops over the row tiles that meet segment e,
  zeroes the rows outside the segment and accumulates a_tileᵀ b_tile (int32, or f32 for bf16).

Epilogue (the float ops of the XLA path, in its order): y = f32(acc); y = y - sub; y = y ·
row[t]; y = y · col[e, d]; rows past the sum -> 0; cast to `out`. Each factor is optional;
without any, the accumulator itself is returned (the bf16 GEMMs' f32 sums). int32 accumulation
is exact and each float op is one IEEE operation on the same operands as the XLA epilogue, so
the int8 results are bit-identical to the tiled and ragged paths. A product of two bf16 values
is exact in f32, but the f32 sums are taken in the kernel's order (chunks of the contracted dim,
row tiles for dW): bf16 results agree with the other paths up to the rounding of f32 sums taken
in another order.

Written against the Triton-compatible Pallas API (BlockSpec, program_id, ref indexing with
pl.ds, jnp.dot-style dot_general with int32 or f32 accumulation): block shapes are powers of two and
≥ 32, so operands are zero-padded to whole blocks (rows to whole tiles) and the outputs cut
back. `interpret=True` runs the kernels on any backend (the CPU tests); compiled they lower
through Triton on GPU.

Dimension letters: T rows (Tp padded), E experts, K input features, N outputs, C a contracted
dim, D the output columns of a row GEMM, M row tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from s3r.quant import formats

_ACC = formats.accumulator(formats.FORWARD_FORMAT.code_dtype)  # int32: the accumulator of the int8 code GEMMs
OPERANDS = (jnp.dtype(formats.FORWARD_FORMAT.code_dtype), jnp.dtype(jnp.bfloat16))  # int8 (int32 acc.), bf16 (f32)
ROW_TILE = (32, 64)  # bounds of the row tile (power of two ≤ T/E, clipped)
COL_BLOCK = 128  # largest output-column block of the row GEMMs and of dW's N
CONTRACT_BLOCK = 64  # largest contracted-dim chunk of the row GEMMs and dW's K block
_MIN_BLOCK = 32  # Triton's dot wants every block dim ≥ 16 (32 along K for int8) and a power of two
_NUM_WARPS = 4


def row_tile(rows: int, experts: int) -> int:
  """Rows per tile: the largest power of two ≤ rows/experts, clipped to ROW_TILE (static)."""
  per = max(rows // max(experts, 1), 1)
  return min(ROW_TILE[1], max(ROW_TILE[0], 1 << (per.bit_length() - 1)))


def _block(dim: int, cap: int) -> int:
  """A power-of-two block ≥ _MIN_BLOCK covering `dim`, at most `cap`."""
  return max(_MIN_BLOCK, min(cap, 1 << max(dim - 1, 0).bit_length()))


def _pad(a: jax.Array, axis: int, multiple: int) -> jax.Array:
  extra = -a.shape[axis] % multiple
  if extra == 0:
    return a
  widths = [(0, 0)] * a.ndim
  widths[axis] = (0, extra)
  return jnp.pad(a, widths)


def _append_factor(operands: list, specs: list, factor, spec, *pads: tuple[int, int]) -> None:
  """Append an optional epilogue factor (as f32, padded to each (axis, multiple)) and its BlockSpec."""
  if factor is None:
    return
  factor = factor.astype(jnp.float32)
  for axis, multiple in pads:
    factor = _pad(factor, axis, multiple)
  operands.append(factor)
  specs.append(spec)


def _bounds(group_sizes: jax.Array):
  """(starts [E], ends [E]) of the segments; `group_sizes` already sanitized (≥ 0, sum ≤ T)."""
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))
  return ends - group_sizes, ends


def _compiler(interpret: bool) -> dict:
  if interpret:
    return {"interpret": True}
  from jax.experimental.pallas import triton as plgpu

  return {"compiler_params": plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=2)}


def epilogue(acc, sub=None, row=None, col=None, valid=None, out=jnp.float32) -> jax.Array:
  """f32(acc) - sub, · row, · col (each optional, in this order), 0 where not `valid`, as `out`.

  One definition for the kernels (on one block) and the XLA path of gemm.py (on the whole
  product), so both round identically. Without any factor the accumulator is only masked and cast.
  """
  y = acc
  if sub is not None or row is not None or col is not None:
    y = acc.astype(jnp.float32)
    if sub is not None:
      y = y - sub
    if row is not None:
      y = y * row
    if col is not None:
      y = y * col
  if valid is not None:
    y = jnp.where(valid, y, jnp.zeros_like(y))
  return y.astype(out)


def _blocks(rows: int, experts: int, contract: int, cols: int) -> tuple[int, int, int]:
  """(row tile, contracted-dim block, output-column block) of a grouped GEMM (static)."""
  return row_tile(rows, experts), _block(contract, CONTRACT_BLOCK), _block(cols, COL_BLOCK)


# --- forward and dX: rows grouped by expert -----------------------------------------------------


def _accumulator(fn: str, a: jax.Array, b: jax.Array):
  """The accumulator of the kernels' GEMM on a and b: int32 for int8, f32 for bf16 (the only pairs)."""
  if a.dtype != b.dtype or a.dtype not in OPERANDS:
    raise TypeError(f"{fn}: operands must both be int8 or both bf16, got {a.dtype} and {b.dtype}")
  return formats.accumulator(a.dtype)


def _row_kernel(*refs, tile, cblock, dblock, n_chunks, contract_last, has_sub, has_row, has_col, acc, out):
  first_ref, last_ref, starts_ref, ends_ref, a_ref, b_ref = refs[:6]
  rest = list(refs[6:])
  sub_ref = rest.pop(0) if has_sub else None
  row_ref = rest.pop(0) if has_row else None
  col_ref = rest.pop(0) if has_col else None
  (o_ref,) = rest
  m, j = pl.program_id(0), pl.program_id(1)
  d0 = pl.multiple_of(j * dblock, dblock)
  rows_L = m * tile + lax.broadcasted_iota(jnp.int32, (tile,), 0)
  sub = None if sub_ref is None else sub_ref[...]
  row = None if row_ref is None else row_ref[...][:, None]

  def expert(e, y_LxD):
    def chunk(c, acc_LxD):
      c0 = pl.multiple_of(c * cblock, cblock)
      a_LxC = a_ref[:, pl.ds(c0, cblock)]
      if contract_last:  # b[e] is [D, C]: out = a b[e]ᵀ
        b_blk = b_ref[e, pl.ds(d0, dblock), pl.ds(c0, cblock)]
        dims = (((1,), (1,)), ((), ()))
      else:  # b[e] is [C, D]
        b_blk = b_ref[e, pl.ds(c0, cblock), pl.ds(d0, dblock)]
        dims = (((1,), (0,)), ((), ()))
      return acc_LxD + lax.dot_general(a_LxC, b_blk, dims, preferred_element_type=acc)

    acc_LxD = lax.fori_loop(0, n_chunks, chunk, jnp.zeros((tile, dblock), acc))
    col = None if col_ref is None else col_ref[e, pl.ds(d0, dblock)][None, :]
    in_seg_L = (rows_L >= starts_ref[e]) & (rows_L < ends_ref[e])
    return jnp.where(in_seg_L[:, None], epilogue(acc_LxD, sub, row, col, out=out), y_LxD)

  y_LxD = lax.fori_loop(first_ref[m], last_ref[m] + 1, expert, jnp.zeros((tile, dblock), out))
  total = ends_ref[ends_ref.shape[0] - 1]
  o_ref[...] = jnp.where((rows_L < total)[:, None], y_LxD, jnp.zeros_like(y_LxD))


def _tile_experts(starts_E, ends_E, tiles: int, tile: int):
  """(first, last) expert whose segment meets each row tile; last < first for a tile past the sum."""
  start_M = jnp.arange(tiles, dtype=jnp.int32) * tile
  total = ends_E[-1]
  first_M = jnp.searchsorted(ends_E, start_M, side="right").astype(jnp.int32)
  last_M = jnp.searchsorted(ends_E, jnp.minimum(start_M + tile, total) - 1, side="right").astype(jnp.int32)
  return first_M, jnp.where(start_M < total, last_M, first_M - 1)


def gmm_rows(
  a_TxC: jax.Array,
  b_ExCxD: jax.Array,
  group_sizes: jax.Array,
  *,
  contract_last: bool = False,
  sub_TxD: jax.Array | None = None,
  row_T: jax.Array | None = None,
  col_ExD: jax.Array | None = None,
  out=_ACC,
  interpret: bool = False,
) -> jax.Array:
  """out[t] = epilogue(a[t] b[e(t)]) (or a[t] b[e(t)]ᵀ with `contract_last`), [T, D] in `out`.

  `a` and `b` both int8 (int32 accumulators) or both bf16 (f32 accumulators); `group_sizes` [E]
  sanitized (gemm.sanitize). Epilogue factors:
  `sub_TxD` f32 subtracted, `row_T` f32 per row, `col_ExD` f32 per (expert, output column).
  """
  acc = _accumulator("gmm_rows", a_TxC, b_ExCxD)
  rows, c_dim = a_TxC.shape
  experts = b_ExCxD.shape[0]
  d_dim = b_ExCxD.shape[1] if contract_last else b_ExCxD.shape[2]
  tile, cblock, dblock = _blocks(rows, experts, c_dim, d_dim)
  a_p = _pad(_pad(a_TxC, 0, tile), 1, cblock)
  c_ax, d_ax = (2, 1) if contract_last else (1, 2)
  b_p = _pad(_pad(b_ExCxD, c_ax, cblock), d_ax, dblock)
  tiles, d_pad = a_p.shape[0] // tile, b_p.shape[d_ax]
  starts_E, ends_E = _bounds(group_sizes)
  first_M, last_M = _tile_experts(starts_E, ends_E, tiles, tile)
  full = pl.no_block_spec
  operands = [first_M, last_M, starts_E, ends_E, a_p, b_p]
  specs = [full, full, full, full, pl.BlockSpec((tile, a_p.shape[1]), lambda m, j: (m, 0)), full]
  _append_factor(operands, specs, sub_TxD, pl.BlockSpec((tile, dblock), lambda m, j: (m, j)), (0, tile), (1, dblock))
  _append_factor(operands, specs, row_T, pl.BlockSpec((tile,), lambda m, j: (m,)), (0, tile))
  _append_factor(operands, specs, col_ExD, full, (1, dblock))
  kernel = functools.partial(
    _row_kernel,
    tile=tile,
    cblock=cblock,
    dblock=dblock,
    n_chunks=a_p.shape[1] // cblock,
    contract_last=contract_last,
    has_sub=sub_TxD is not None,
    has_row=row_T is not None,
    has_col=col_ExD is not None,
    acc=acc,
    out=out,
  )
  y = pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((a_p.shape[0], d_pad), out),
    grid=(tiles, d_pad // dblock),
    in_specs=specs,
    out_specs=pl.BlockSpec((tile, dblock), lambda m, j: (m, j)),
    name="s3r_grouped_gmm",
    **_compiler(interpret),
  )(*operands)
  return y[:rows, :d_dim]


# --- dW: per-expert contraction over the expert's rows ------------------------------------------


def _tgmm_kernel(*refs, tile, kblock, nblock, has_sub, has_col, acc, out):
  starts_ref, ends_ref, a_ref, b_ref = refs[:4]
  rest = list(refs[4:])
  sub_ref = rest.pop(0) if has_sub else None
  col_ref = rest.pop(0) if has_col else None
  (o_ref,) = rest
  e, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  k0, n0 = pl.multiple_of(i * kblock, kblock), pl.multiple_of(j * nblock, nblock)
  start, end = starts_ref[e], ends_ref[e]

  def window(tile_i, acc_KxN):
    row0 = pl.multiple_of(tile_i * tile, tile)
    rows_L = row0 + lax.broadcasted_iota(jnp.int32, (tile,), 0)
    a_LxK = a_ref[pl.ds(row0, tile), pl.ds(k0, kblock)]
    b_LxN = b_ref[pl.ds(row0, tile), pl.ds(n0, nblock)]
    in_seg_L = (rows_L >= start) & (rows_L < end)  # both operands masked: a NaN or inf of another row stays out
    a_LxK = jnp.where(in_seg_L[:, None], a_LxK, jnp.zeros_like(a_LxK))
    b_LxN = jnp.where(in_seg_L[:, None], b_LxN, jnp.zeros_like(b_LxN))
    prod = lax.dot_general(a_LxK, b_LxN, (((0,), (0,)), ((), ())), preferred_element_type=acc)
    return acc_KxN + prod

  first, stop = lax.div(start, tile), lax.div(end + tile - 1, tile)  # both ≥ 0: truncation is floor
  acc_KxN = lax.fori_loop(first, stop, window, jnp.zeros((kblock, nblock), acc))
  sub = None if sub_ref is None else sub_ref[...]
  col = None if col_ref is None else col_ref[e, pl.ds(n0, nblock)][None, :]
  o_ref[...] = epilogue(acc_KxN, sub, None, col, out=out)


def tgmm(
  a_TxK: jax.Array,
  b_TxN: jax.Array,
  group_sizes: jax.Array,
  *,
  sub_ExKxN: jax.Array | None = None,
  col_ExN: jax.Array | None = None,
  out=_ACC,
  interpret: bool = False,
) -> jax.Array:
  """out[e] = epilogue(Σ_{t in segment e} a[t]ᵀ b[t]), [E, K, N] in `out` (0 for an empty segment).

  `a`, `b` both int8 or both bf16; `group_sizes` [E] sanitized. Epilogue: `sub_ExKxN` f32 subtracted, then
  `col_ExN` f32 per (expert, column). Rows outside every segment never enter a product.
  """
  acc = _accumulator("tgmm", a_TxK, b_TxN)
  rows, k_dim = a_TxK.shape
  n_dim, experts = b_TxN.shape[1], group_sizes.shape[0]
  tile, kblock, nblock = _blocks(rows, experts, k_dim, n_dim)
  a_p = _pad(_pad(a_TxK, 0, tile), 1, kblock)
  b_p = _pad(_pad(b_TxN, 0, tile), 1, nblock)
  starts_E, ends_E = _bounds(group_sizes)
  full = pl.no_block_spec
  block = pl.BlockSpec((pl.squeezed, kblock, nblock), lambda e, i, j: (e, i, j))
  operands, specs = [starts_E, ends_E, a_p, b_p], [full, full, full, full]
  _append_factor(operands, specs, sub_ExKxN, block, (1, kblock), (2, nblock))
  _append_factor(operands, specs, col_ExN, full, (1, nblock))
  kernel = functools.partial(
    _tgmm_kernel,
    tile=tile,
    kblock=kblock,
    nblock=nblock,
    has_sub=sub_ExKxN is not None,
    has_col=col_ExN is not None,
    acc=acc,
    out=out,
  )
  shape = (experts, a_p.shape[1], b_p.shape[1])
  y = pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct(shape, out),
    grid=(experts, shape[1] // kblock, shape[2] // nblock),
    in_specs=specs,
    out_specs=block,
    name="s3r_grouped_tgmm",
    **_compiler(interpret),
  )(*operands)
  return y[:, :k_dim, :n_dim]
