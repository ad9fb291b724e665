"""Number formats of the quantized codes: each one's grid, dtypes, step, clipping and dequantization.

A `Format` is everything the layer needs to know about the codes of one tensor (docs/algorithm.md §1
and "Gradient formats"): its grid, the dtype the codes are stored in, the accumulator dtype of a GEMM
on those codes, the per-tensor step that maps a tensor's max |x| onto the grid (an all-zero tensor
gets 1, never 0), the rounding and clipping of scaled values into codes, and their dequantization
(codes times step).

The forward pass is always INT8 (`FORWARD_FORMAT`); a recipe names the format of the backward's
gradient codes Q (`Recipe.grad_format`, looked up with `get_format`):
- uniform grids, the integers in [-Q, Q] with one per-tensor step Δ = max|G'| / Q: `int8` (Q = 127),
  `int6` (Q = 31) and `int4` (Q = 7). Their codes are stored as int8 and their GEMMs run
  int8 x int8 -> int32.
- block-scaled FP4 (grid "e2m1", the values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}): `nvfp4` (a per-tensor
  step Δ = max|G'| / (6 · 448) and one E4M3 scale per square block of 16 x 16) and `mxfp4` (no tensor
  step, Δ = 1, and one power-of-two E8M0 scale per square block of 32 x 32). The blocks tile the
  last two dims (tokens x channels, every leading dim flattened into the tokens) so that one
  quantization feeds both backward GEMMs; a dim that the block does not divide ends in a partial
  block. The codes handed to the GEMMs are the block-dequantized values code · s_blk in units of Δ,
  exact in f32 (an E2M1 value times an E4M3 or power-of-two scale has at most 6 significant bits),
  and the GEMMs on them are exact f32 emulations (f32 products of dequantized codes): they say
  nothing about the speed of FP4 hardware.

A new format is one more `Format` in `_FORMATS` (a new kind of grid also branches `scale`, `round`
and `dot_general` on it) plus its tests.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from s3r.quant.reductions import abs_max

# "uniform": the codes are the integers in [-qmax, qmax], one real step per scale;
# "e2m1": FP4 values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} times a per-block scale (and the per-tensor step)
GRIDS = ("uniform", "e2m1")
BLOCK_SCALES = ("none", "e4m3", "e8m0")  # the per-block scale of a block-scaled grid: E4M3, or a power of two
E2M1_MAX = 6  # the largest E2M1 value
E4M3_MAX = 448  # the largest finite E4M3 value
# every positive finite E4M3 value, ascending (bit patterns 0x01..0x7e; 0x7f is NaN)
_E4M3_VALUES = np.arange(1, 127, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32)
_E8M0_EXPONENTS = (-126, 127)  # power-of-two scales kept to f32's normal range


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format:
  """One number format of quantized codes (hashable: recipes and custom-VJP arguments name it)."""

  name: str  # registry name, e.g. "int8"
  grid: str  # one of GRIDS
  qmax: int  # the largest code value: codes live in [-qmax, qmax] (6 for E2M1)
  code_dtype: np.dtype  # storage dtype of the codes (anything np.dtype accepts; stored as np.dtype)
  acc_dtype: np.dtype  # accumulator dtype of a GEMM on two code tensors
  block: int = 0  # side of the square blocks that share one scale ("e2m1"); 0 for a per-tensor step only
  block_scale: str = "none"  # one of BLOCK_SCALES: "e4m3" (with a per-tensor step) or "e8m0" (without)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"Format.name must be a non-empty str, got {self.name!r}")
    if self.grid not in GRIDS:
      raise ValueError(f"Format.grid must be one of {GRIDS}, got {self.grid!r}")
    if not isinstance(self.qmax, int) or isinstance(self.qmax, bool) or self.qmax < 1:
      raise ValueError(f"Format.qmax must be an int >= 1, got {self.qmax!r}")
    for field in ("code_dtype", "acc_dtype"):
      try:
        dtype = np.dtype(getattr(self, field))
      except TypeError:
        raise ValueError(f"Format.{field} must be a numeric dtype, got {getattr(self, field)!r}") from None
      if dtype.kind not in "iuf":
        raise ValueError(f"Format.{field} must be a numeric dtype, got {dtype.name}")
      object.__setattr__(self, field, dtype)
    code, acc = self.code_dtype, self.acc_dtype
    if code.kind in "iu" and self.qmax > np.iinfo(code).max:
      raise ValueError(f"Format.qmax {self.qmax} does not fit code_dtype {code.name}")
    integer = code.kind in "iu"  # integer codes need a wider (exact) accumulator; float codes a float one
    wide_enough = acc.itemsize > code.itemsize if integer else acc.itemsize >= code.itemsize
    if integer != (acc.kind in "iu") or not wide_enough:
      raise ValueError(
        f"Format.acc_dtype must be of code_dtype {code.name}'s kind (integer or float) and "
        f"{'wider' if integer else 'at least as wide'}, got {acc.name}"
      )
    self._check_blocks()

  def _check_blocks(self):
    if self.block_scale not in BLOCK_SCALES:
      raise ValueError(f"Format.block_scale must be one of {BLOCK_SCALES}, got {self.block_scale!r}")
    if not isinstance(self.block, int) or isinstance(self.block, bool) or self.block < 0:
      raise ValueError(f"Format.block must be an int >= 0, got {self.block!r}")
    if self.grid == "uniform":
      if self.block or self.block_scale != "none":
        raise ValueError(
          f"Format.block and block_scale must be 0 and 'none' for grid='uniform', "
          f"got {self.block}, {self.block_scale!r}"
        )
      return
    if self.qmax != E2M1_MAX:
      raise ValueError(f"Format.qmax must be {E2M1_MAX} (the largest E2M1 value) for grid='e2m1', got {self.qmax}")
    if self.code_dtype != np.float32:
      raise ValueError(f"Format.code_dtype must be float32 for grid='e2m1' (emulated codes), got {self.code_dtype}")
    if self.block < 1 or self.block_scale == "none":
      raise ValueError(
        f"Format.block (>= 1) and block_scale ('e4m3' or 'e8m0') are needed for grid='e2m1', "
        f"got {self.block}, {self.block_scale!r}"
      )

  @property
  def inv_qmax(self) -> np.float32:
    """f32(1/Q): uniform steps are computed as max|x| · f32(1/Q) (see `scale`)."""
    return np.float32(1.0 / self.qmax)

  @property
  def tensor_max(self) -> int | None:
    """The value the per-tensor step maps max|x| onto: Q for a uniform grid, 6 · 448 for E4M3 block
    scales (the largest code times the largest block scale); None without a tensor step (E8M0)."""
    if self.grid == "uniform":
      return self.qmax
    return self.qmax * E4M3_MAX if self.block_scale == "e4m3" else None

  def scale(self, amax: jax.Array) -> jax.Array:
    """The per-tensor step that maps `amax` = max|x| onto `tensor_max`: amax · f32(1/tensor_max); an
    all-zero slice gets 1, never 0, and a format without a tensor step (E8M0 blocks) always 1.

    A multiplication, not a division: XLA rewrites a division by the constant Q into that
    multiplication anyway (within 1 ulp of the true quotient), so it is written explicitly and
    references can match the result bit for bit.
    """
    top = self.tensor_max
    if top is None:
      return jnp.ones_like(amax)
    step = amax * (self.inv_qmax if top == self.qmax else np.float32(1.0 / top))
    return jnp.where(step == 0, jnp.ones_like(step), step)

  def clip(self, rounded: jax.Array) -> jax.Array:
    """Rounded values (integers, or E2M1 values, held in a float) as codes: clipped to [-Q, Q], in code_dtype."""
    return jnp.clip(rounded, -self.qmax, self.qmax).astype(self.code_dtype)

  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """Codes of v (values in units of the step): RTNE(v) without a threshold, else the stochastic
    rounding floor(v + u) with `threshold` u (broadcast against v); then clipped.

    Block-scaled grids (E2M1) first divide v by its block's scale (`block_scales`) and clip it to
    [-6, 6]; then in the gap [lo, hi) of the grid that holds w = v / s_blk, with width d = hi - lo,
    the code is d · RTNE(w / d) (ties to the even code), or d · floor(w / d + u): hi exactly when
    p + u >= 1 for p = (w - lo) / d. Returned as code · s_blk (exact in f32), in units of the step.
    """
    if self.grid == "uniform":
      return self.clip(jnp.round(v) if threshold is None else jnp.floor(v + threshold))
    s_blk = expand_blocks(self.block_scales(v), v.shape, self.block)
    w = jnp.clip(v * (jnp.float32(1) / s_blk), -self.qmax, self.qmax)
    gap = e2m1_gap(w)
    k = w * (jnp.float32(1) / gap)  # exact: the gap is 0.5, 1 or 2
    code = self.clip(gap * (jnp.round(k) if threshold is None else jnp.floor(k + threshold)))
    return code * s_blk

  def block_scales(self, v: jax.Array) -> jax.Array:
    """The scales s_blk [ceil(T/b), ceil(N/b)] of the square b x b blocks of v [..., N] (leading dims
    flattened into T): the smallest E4M3 value (or power of two, E8M0) >= max_blk |v| / 6, so that
    no element of a block exceeds 6 · s_blk; an all-zero block gets 1, a block holding a NaN or an Inf
    NaN. A partial last block (a dim
    b does not divide) takes the max over the elements it has."""
    if self.grid == "uniform":
      raise ValueError(f"format {self.name!r} has no block scales (grid 'uniform')")
    x = block_amax(v, self.block) * np.float32(1.0 / self.qmax)
    s = e4m3_ceil(x) if self.block_scale == "e4m3" else e8m0_ceil(x)
    s = jnp.where(x == 0, jnp.ones_like(s), s)
    return jnp.where(jnp.isfinite(x), s, x)  # NaN for a non-finite block: its codes (code · s_blk) are NaN

  def dequantize(self, codes: jax.Array, step: jax.Array | None = None) -> jax.Array:
    """The real values (f32) of `codes` times `step` (broadcast); in units of the step without one."""
    values = codes.astype(jnp.float32)
    return values if step is None else values * step

  def dot_general(self, a: jax.Array, b: jax.Array, dimension_numbers) -> jax.Array:
    """A GEMM on two code tensors, accumulated exactly in acc_dtype. Float codes (the emulated
    block-scaled grids) multiply as f32 at the highest precision (an int8 operand is converted)."""
    if self.code_dtype.kind != "f":
      return lax.dot_general(a, b, dimension_numbers, preferred_element_type=self.acc_dtype)
    a, b = a.astype(self.code_dtype), b.astype(self.code_dtype)
    hi = lax.Precision.HIGHEST
    return lax.dot_general(a, b, dimension_numbers, precision=hi, preferred_element_type=self.acc_dtype)

  @property
  def emulated(self) -> bool:
    """True when the GEMMs on these codes are f32 emulations (no native FP4 GEMM is used)."""
    return self.code_dtype.kind == "f"


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


def _uniform(name: str, qmax: int) -> Format:
  return Format(name=name, grid="uniform", qmax=qmax, code_dtype=np.dtype(np.int8), acc_dtype=np.dtype(np.int32))


def _fp4(name: str, block: int, block_scale: str) -> Format:
  f32 = np.dtype(np.float32)
  return Format(
    name=name, grid="e2m1", qmax=E2M1_MAX, code_dtype=f32, acc_dtype=f32, block=block, block_scale=block_scale
  )


INT8 = _uniform("int8", 127)
FORWARD_FORMAT = INT8  # the forward's activation and weight codes (every quantized recipe)

_FORMATS = (INT8, _uniform("int6", 31), _uniform("int4", 7), _fp4("nvfp4", 16, "e4m3"), _fp4("mxfp4", 32, "e8m0"))


def _registry(formats: tuple[Format, ...]) -> tuple[dict[str, Format], dict[np.dtype, np.dtype]]:
  """(name -> format, code dtype -> accumulator dtype); formats sharing a code dtype share its GEMM."""
  by_name, accumulators = {}, {}
  for f in formats:
    if f.name in by_name:
      raise ValueError(f"two formats are named {f.name!r}")
    by_name[f.name] = f
    if accumulators.setdefault(f.code_dtype, f.acc_dtype) != f.acc_dtype:
      raise ValueError(
        f"format {f.name!r}: acc_dtype {f.acc_dtype.name} differs from the other {f.code_dtype.name} formats'"
      )
  return by_name, accumulators


FORMATS, _ACCUMULATORS = _registry(_FORMATS)


def get_format(name_or_format: str | Format) -> Format:
  """The registered format called `name_or_format` (a Format passes through)."""
  if isinstance(name_or_format, Format):
    return name_or_format
  try:
    return FORMATS[name_or_format]
  except (KeyError, TypeError):
    raise ValueError(f"unknown number format {name_or_format!r}; valid names: {', '.join(FORMATS)}") from None


def accumulator(dtype) -> np.dtype:
  """The accumulator dtype of a GEMM on operands of `dtype`: that of the formats whose codes are
  stored in it, f32 for any other (float) operand."""
  return _ACCUMULATORS.get(np.dtype(dtype), np.dtype(np.float32))
