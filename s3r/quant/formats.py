"""Number formats of the quantized codes: each one's grid, dtypes, step, clipping and dequantization.

A `Format` is everything the layer needs to know about the codes of one tensor (docs/algorithm.md §1):
its grid (the integers in [-Q, Q] for a uniform grid, Q its largest code), the dtype the codes are
stored in, the accumulator dtype of a GEMM on those codes, the step that maps a tensor's max |x|
onto Q (s = max|x| / Q, Δ = max|G'| / Q; an all-zero tensor gets 1, never 0), the rounding and
clipping of scaled values into codes, and their dequantization (codes times step).

The forward pass is always INT8 (`FORWARD_FORMAT`); a recipe names the format of the backward's
gradient codes Q (`Recipe.grad_format`, looked up with `get_format`). Only `int8` (Q = 127, int8
codes, int8 x int8 -> int32 GEMMs) exists today.

Adding a format touches this module, recipes.py and the tests only:
- a coarser uniform grid (`int6` with Q = 31, `int4` with Q = 7) is one more `Format` in
  `_FORMATS` with the same per-tensor step; its codes may still be stored as int8 and its GEMMs
  run int8 x int8 -> int32 (`accumulator` is keyed by the code dtype);
- block-scaled FP4 (E2M1 codes with NVFP4's blocks of 16 and E4M3 block scales, or MXFP4's
  blocks of 32 and E8M0 scales) is a new `grid` kind, whose `scale`, `round` and `dequantize`
  branch on it; its GEMMs run as exact f32 emulations (f32 products of dequantized codes).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

GRIDS = ("uniform",)  # "uniform": the codes are the integers in [-qmax, qmax], one real step per scale


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format:
  """One number format of quantized codes (hashable: recipes and custom-VJP arguments name it)."""

  name: str  # registry name, e.g. "int8"
  grid: str  # one of GRIDS
  qmax: int  # Q, the largest code: codes live in [-Q, Q]
  code_dtype: np.dtype  # storage dtype of the codes (anything np.dtype accepts; stored as np.dtype)
  acc_dtype: np.dtype  # accumulator dtype of a GEMM on two code tensors

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

  @property
  def inv_qmax(self) -> np.float32:
    """f32(1/Q): steps are computed as max|x| · f32(1/Q) (see `scale`)."""
    return np.float32(1.0 / self.qmax)

  def scale(self, amax: jax.Array) -> jax.Array:
    """The step that maps `amax` = max|x| onto Q: amax · f32(1/Q); an all-zero slice gets 1, never 0.

    A multiplication, not a division: XLA rewrites a division by the constant Q into that
    multiplication anyway (within 1 ulp of the true quotient), so it is written explicitly and
    references can match the result bit for bit.
    """
    step = amax * self.inv_qmax
    return jnp.where(step == 0, jnp.ones_like(step), step)

  def clip(self, rounded: jax.Array) -> jax.Array:
    """Rounded values (integers held in a float) as codes: clipped to [-Q, Q], in code_dtype."""
    return jnp.clip(rounded, -self.qmax, self.qmax).astype(self.code_dtype)

  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """Codes of v (values in units of the step): RTNE(v) without a threshold, else the stochastic
    rounding floor(v + u) with `threshold` u (broadcast against v); then clipped."""
    return self.clip(jnp.round(v) if threshold is None else jnp.floor(v + threshold))

  def dequantize(self, codes: jax.Array, step: jax.Array | None = None) -> jax.Array:
    """The real values (f32) of `codes` times `step` (broadcast); in units of the step without one."""
    values = codes.astype(jnp.float32)
    return values if step is None else values * step

  def dot_general(self, a: jax.Array, b: jax.Array, dimension_numbers) -> jax.Array:
    """A GEMM on two code tensors, accumulated exactly in acc_dtype."""
    return lax.dot_general(a, b, dimension_numbers, preferred_element_type=self.acc_dtype)


INT8 = Format(name="int8", grid="uniform", qmax=127, code_dtype=np.dtype(np.int8), acc_dtype=np.dtype(np.int32))
FORWARD_FORMAT = INT8  # the forward's activation and weight codes (every quantized recipe)

_FORMATS = (INT8,)


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
