"""The `Format` interface of the quantized codes, its `Capabilities`, and the GEMM on two code tensors
(`code_dot_general`); one subclass per kind of grid lives beside it (the package doc lists them)."""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

GRIDS = ("uniform", "e2m1", "float", "block_float")  # the `grid` of each Format subclass
BLOCK_SCALES = ("none", "e4m3", "e8m0")  # the per-block scale of a block-scaled grid: E4M3, or a power of two
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.default_backend() names that `Capabilities.native_gemm` lists


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
  """What the code paths can do with a format's codes; checked where a path needs it."""

  native_gemm: tuple[
    str, ...
  ]  # platforms with a native low-precision GEMM on these codes (for FP8: with FP8 partner codes)
  integer_codes: bool  # codes are integers: the rounding error in units of Δ is at most 1 (S3R-EC's int8 digits)
  grouped: bool  # the grouped (expert) GEMMs take these codes (integer ones in the Pallas kernels too)
  column_tp: bool  # column tensor parallelism's per-shard partial sums of the dX GEMM take these codes

  def __post_init__(self):
    unknown = [p for p in self.native_gemm if p not in PLATFORMS]
    if not isinstance(self.native_gemm, tuple) or unknown:
      raise ValueError(f"Capabilities.native_gemm must be a tuple of {PLATFORMS}, got {self.native_gemm!r}")


_INTEGER = Capabilities(native_gemm=PLATFORMS, integer_codes=True, grouped=True, column_tp=True)
_EMULATED = Capabilities(native_gemm=(), integer_codes=False, grouped=False, column_tp=False)
_FP8 = Capabilities(native_gemm=("cuda",), integer_codes=False, grouped=True, column_tp=False)
# the FP8 dtypes of the tensor cores (Hopper and later): a dot on two of them is a native FP8 GEMM there
NATIVE_FP8_DTYPES = (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))


def code_dot_general(a: jax.Array, b: jax.Array, dimension_numbers) -> jax.Array:
  """The GEMM on two code tensors, chosen by their dtypes (see the module doc): integer x integer
  exact in int32; FP8 x FP8 with f32 results (native on Hopper, an exact f32 emulation on XLA:CPU);
  any other pair an exact f32 emulation (operands converted to f32, multiplied at the highest
  precision)."""
  da, db = np.dtype(a.dtype), np.dtype(b.dtype)
  if da.kind in "iu" and db.kind in "iu":
    return lax.dot_general(a, b, dimension_numbers, preferred_element_type=jnp.int32)
  if da in NATIVE_FP8_DTYPES and db in NATIVE_FP8_DTYPES:
    return lax.dot_general(a, b, dimension_numbers, preferred_element_type=jnp.float32)
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  hi = lax.Precision.HIGHEST
  return lax.dot_general(a, b, dimension_numbers, precision=hi, preferred_element_type=jnp.float32)


def _is_number_dtype(dtype: np.dtype) -> bool:
  return dtype.kind in "iu" or bool(jnp.issubdtype(dtype, jnp.floating))


def _check_int(owner: str, field: str, value, low: int) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise ValueError(f"{owner}.{field} must be an int >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format(abc.ABC):
  """One number format of quantized codes (hashable: recipes and custom-VJP arguments name it)."""

  grid: ClassVar[str]  # one of GRIDS: the kind of grid, one subclass each
  capabilities: ClassVar[Capabilities]

  name: str  # registry name, e.g. "int8"
  qmax: int  # the largest code value: codes live in [-qmax, qmax]
  code_dtype: np.dtype  # storage dtype of the codes (anything np.dtype accepts; stored as np.dtype)
  acc_dtype: np.dtype  # accumulator dtype of a GEMM on two code tensors

  def __post_init__(self):
    owner = type(self).__name__
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"{owner}.name must be a non-empty str, got {self.name!r}")
    _check_int(owner, "qmax", self.qmax, 1)
    for field in ("code_dtype", "acc_dtype"):
      try:
        dtype = np.dtype(getattr(self, field))
      except TypeError:
        raise ValueError(f"{owner}.{field} must be a numeric dtype, got {getattr(self, field)!r}") from None
      if not _is_number_dtype(dtype):
        raise ValueError(f"{owner}.{field} must be a numeric dtype, got {dtype.name}")
      object.__setattr__(self, field, dtype)
    code, acc = self.code_dtype, self.acc_dtype
    if code.kind in "iu" and self.qmax > np.iinfo(code).max:
      raise ValueError(f"{owner}.qmax {self.qmax} does not fit code_dtype {code.name}")
    integer = code.kind in "iu"  # integer codes need a wider (exact) accumulator; float codes a float one
    wide_enough = acc.itemsize > code.itemsize if integer else acc.itemsize >= code.itemsize
    if integer != (acc.kind in "iu") or not wide_enough:
      raise ValueError(
        f"{owner}.acc_dtype must be of code_dtype {code.name}'s kind (integer or float) and "
        f"{'wider' if integer else 'at least as wide'}, got {acc.name}"
      )

  @property
  def inv_qmax(self) -> np.float32:
    """f32(1/Q): steps are computed as max|x| · f32(1/tensor_max) (see `scale`)."""
    return np.float32(1.0 / self.qmax)

  @property
  @abc.abstractmethod
  def tensor_max(self) -> int | None:
    """The value the per-tensor step maps max|x| onto; None for a format without a tensor step."""

  @property
  def emulated(self) -> bool:
    """True when the GEMMs on these codes are f32 emulations on every platform."""
    return not self.capabilities.native_gemm

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
    """Rounded values (grid values held in a float) as codes: clipped to [-Q, Q], in code_dtype."""
    return jnp.clip(rounded, -self.qmax, self.qmax).astype(self.code_dtype)

  @abc.abstractmethod
  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """Codes of v (values in units of the step): to nearest (ties to even) without a threshold, else
    stochastically with `threshold` u in (0, 1) (broadcast against v); clipped to the grid."""

  def dequantize(self, codes: jax.Array, step: jax.Array | None = None) -> jax.Array:
    """The real values (f32) of `codes` times `step` (broadcast); in units of the step without one."""
    values = codes.astype(jnp.float32)
    return values if step is None else values * step

  def dot_general(self, a: jax.Array, b: jax.Array, dimension_numbers) -> jax.Array:
    """A GEMM on two code tensors (these codes and the forward's, or two forward code tensors),
    exact in its accumulator: `code_dot_general`, chosen by the operands' dtypes."""
    return code_dot_general(a, b, dimension_numbers)
