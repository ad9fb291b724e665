"""NumPy references of the gradient formats (docs/algorithm.md, "Gradient formats"), written from the
definitions (every FP8 value enumerated, the E2M1 grid listed), not from s3r.quant.formats (whose
registry only names the formats and their parameters here)."""

import ml_dtypes
import numpy as np

from s3r.quant.formats import FORMATS, BlockScaledFormat

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)  # code index = position (even index: even code)
GRID = np.concatenate([-E2M1[:0:-1], E2M1])  # the 15 signed values, ascending
_E4M3 = np.sort(np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64))))
_E4M3 = _E4M3[np.isfinite(_E4M3) & (_E4M3 > 0)]


def _fp8_grid(dtype) -> tuple[np.ndarray, np.ndarray]:
  """(every finite value of an FP8 dtype, ascending, -0 and 0 as one; whether its mantissa is even),
  enumerated from all 256 bit patterns."""
  bits = np.arange(256, dtype=np.uint8)
  values = bits.view(dtype).astype(np.float64)
  keep = np.isfinite(values) & ~((values == 0) & (bits >= 128))  # drop NaN, inf and -0
  order = np.argsort(values[keep])
  return values[keep][order], (bits[keep][order] % 2 == 0)


FP8_GRIDS = {"e4m3": _fp8_grid(ml_dtypes.float8_e4m3fn), "e5m2": _fp8_grid(ml_dtypes.float8_e5m2)}


def _element(fmt: str) -> str | None:
  """The FP8 grid ("e4m3" or "e5m2") of a format's elements: the format itself or a block-scaled one's."""
  f = FORMATS[fmt]
  if fmt in FP8_GRIDS:
    return fmt
  dtype = getattr(f, "element_dtype", None)
  return None if dtype is None else {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}[dtype.name]


def step(fmt: str, amax: np.float32) -> np.float32:
  """Δ: max|G'| / Q for a uniform grid, / (6 · 448) for nvfp4, 1 for power-of-two block scales
  (mxfp4, mxfp8, e4m3_b128), / (the largest finite value) for FP8; 1 for an all-zero tensor."""
  f = FORMATS[fmt]
  if getattr(f, "block_scale", None) == "e8m0":
    return np.float32(1)
  top = {"nvfp4": 6 * 448, "e4m3": 448, "e5m2": 57344}.get(fmt, f.qmax)
  s = np.float32(amax) * np.float32(1 / top)
  return np.float32(1) if s == 0 else s


def block_scales(fmt: str, v_TxN: np.ndarray) -> np.ndarray:
  """Each element's block scale [T, N]: the smallest E4M3 value (or power of two) >= max_blk|v| / qmax
  (6 for FP4, the largest FP8 value for FP8 elements) over its square block (a partial block at the
  end of a dim), 1 for an all-zero block."""
  f = FORMATS[fmt]
  assert isinstance(f, BlockScaledFormat)
  b, top = f.block, f.qmax
  out = np.empty(v_TxN.shape, np.float32)
  for i in range(0, v_TxN.shape[0], b):
    for j in range(0, v_TxN.shape[1], b):
      x = np.float32(np.abs(v_TxN[i : i + b, j : j + b]).max()) * np.float32(1 / top)
      if x == 0:
        s = 1.0
      elif f.block_scale == "e4m3":
        s = _E4M3[min(np.searchsorted(_E4M3, x, side="left"), len(_E4M3) - 1)]
      else:
        s = 2.0 ** np.ceil(np.log2(np.float64(x)))
      out[i : i + b, j : j + b] = s
  return out


def _in_block_units(fmt: str, v_TxN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(w = v / s_blk clipped to [-qmax, qmax], s_blk) as float64, computed in f32 as the format does."""
  s = block_scales(fmt, v_TxN)
  top = FORMATS[fmt].qmax
  w = np.clip(v_TxN.astype(np.float32) * (np.float32(1) / s), -top, top)
  return w.astype(np.float64), s.astype(np.float64)


def fp4_rtne(w: np.ndarray) -> np.ndarray:
  """The nearest E2M1 value of each w in [-6, 6]; a tie goes to the even code index."""
  dist = np.abs(w[..., None] - GRID)
  best = dist.min(axis=-1, keepdims=True)
  ties = dist == best
  even = (np.abs(np.arange(-7, 8)) % 2 == 0) & ties
  pick = np.where(ties.sum(-1) > 1, np.argmax(even, -1), np.argmax(ties, -1))
  return GRID[pick]


def fp4_gap(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(lo, hi): the largest grid value <= w and the smallest one > w (hi = lo at w = 6)."""
  i = np.clip(np.searchsorted(GRID, w, side="right") - 1, 0, len(GRID) - 1)
  lo = GRID[i]
  hi = GRID[np.minimum(i + 1, len(GRID) - 1)]
  return lo, hi


def fp8_neighbours(fmt: str, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(lo, hi): the largest FP8 value <= v and the smallest one > v (v clipped to the finite range;
  at the largest value hi is the largest value too)."""
  grid, _ = FP8_GRIDS[fmt]
  w = np.clip(v.astype(np.float64), grid[0], grid[-1])
  i = np.clip(np.searchsorted(grid, w, side="right") - 1, 0, len(grid) - 1)
  return grid[i], grid[np.minimum(i + 1, len(grid) - 1)]


def fp8_rtne(fmt: str, v: np.ndarray) -> np.ndarray:
  """The nearest FP8 value of each v (clipped to the finite range); a tie goes to the even mantissa."""
  grid, even = FP8_GRIDS[fmt]
  lo, hi = fp8_neighbours(fmt, v)
  w = np.clip(v.astype(np.float64), grid[0], grid[-1])
  lo_even = even[np.searchsorted(grid, lo)]
  tie_lo = (w - lo == hi - w) & lo_even
  return np.where((w - lo < hi - w) | tie_lo, lo, hi)


def rtne_codes(fmt: str, v_TxN: np.ndarray) -> np.ndarray:
  """The RTNE codes of v = G'/Δ in units of Δ (code · s_blk for a block-scaled grid), float64."""
  f = FORMATS[fmt]
  if fmt in FP8_GRIDS:
    return fp8_rtne(fmt, v_TxN)
  if f.grid == "uniform":
    return np.clip(np.round(v_TxN), -f.qmax, f.qmax).astype(np.float64)
  w, s = _in_block_units(fmt, v_TxN)
  element = _element(fmt)
  return (fp4_rtne(w) if element is None else fp8_rtne(element, w)) * s


def code_gap(fmt: str, v_TxN: np.ndarray) -> np.ndarray:
  """hi - lo of the grid gap holding each element, in units of Δ (1 for a uniform grid, else (hi - lo) · s_blk)."""
  f = FORMATS[fmt]
  if fmt in FP8_GRIDS:
    lo, hi = fp8_neighbours(fmt, v_TxN)
    below = fp8_neighbours(fmt, np.nextafter(lo, -np.inf))[0]
    return np.where(hi > lo, hi - lo, lo - below)  # at the largest value: the gap below it
  if f.grid == "uniform":
    return np.ones(v_TxN.shape)
  w, s = _in_block_units(fmt, v_TxN)
  element = _element(fmt)
  if element is not None:
    return code_gap(element, w) * s
  lo, hi = fp4_gap(w)
  return np.where(hi > lo, hi - lo, 2.0) * s


def neighbours(fmt: str, v_TxN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(lo, hi) in units of Δ: the two codes stochastic rounding chooses between for each element."""
  f = FORMATS[fmt]
  if fmt in FP8_GRIDS:
    lo, hi = fp8_neighbours(fmt, v_TxN)
    return lo, np.where(hi > lo, hi, 2 * lo)  # at the largest value p = 0: hi is never chosen
  if f.grid == "uniform":
    lo = np.floor(v_TxN.astype(np.float64))
    return lo, lo + 1
  w, s = _in_block_units(fmt, v_TxN)
  element = _element(fmt)
  if element is not None:
    lo, hi = neighbours(element, w)
    return lo * s, hi * s
  lo, hi = fp4_gap(w)
  return lo * s, np.where(hi > lo, hi, 8.0) * s  # at w = 6, p = 0: hi is never chosen
