"""Number formats of the quantized codes: one class per kind of grid, and the registry of formats.

A `Format` is everything the layer needs to know about the codes of one tensor (docs/algorithm.md §1
and "Gradient formats"): its grid, the dtype the codes are stored in, the accumulator dtype of a GEMM
on those codes, the per-tensor step that maps a tensor's max |x| onto the grid (an all-zero tensor
gets 1, never 0), the rounding (to nearest, or stochastic with a threshold) and clipping of scaled
values into codes, their dequantization (codes times step), the GEMM on them, and its
`Capabilities` (where that GEMM is native, whether the codes are integers, which paths take them).

The forward pass quantizes activations per token and weights per output channel, round to nearest,
into `FORWARD_FORMAT` (int8) or, for an all-FP8 recipe, E4M3 (`Recipe.forward_format`, one of
`FORWARD_FORMATS`); a recipe names the format of the backward's gradient codes Q
(`Recipe.grad_format`, looked up with `get_format`):
- `UniformFormat`, the integers in [-Q, Q] with one per-tensor step Δ = max|G'| / Q: `int8`
  (Q = 127), `int6` (Q = 31) and `int4` (Q = 7). Codes stored as int8, GEMMs int8 x int8 -> int32.
- `E2M1Format`, block-scaled FP4 (the values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}): `nvfp4` (a per-tensor
  step Δ = max|G'| / (6 · 448) and one E4M3 scale per square block of 16 x 16) and `mxfp4` (no tensor
  step, Δ = 1, and one power-of-two E8M0 scale per square block of 32 x 32). The blocks tile the
  last two dims (tokens x channels, every leading dim flattened into the tokens) so that one
  quantization feeds both backward GEMMs; a dim that the block does not divide ends in a partial
  block. The codes handed to the GEMMs are the block-dequantized values code · s_blk in units of Δ,
  exact in f32 (an E2M1 value times an E4M3 or power-of-two scale has at most 6 significant bits).
- `FloatFormat`, the values of an FP8 dtype with one per-tensor step Δ = max|G'| / (its largest
  finite value): `e4m3` (float8_e4m3fn, 448) and `e5m2` (float8_e5m2, 57344). Codes stored in that
  dtype (exactly: they are its values).
- `BlockFloatFormat`, block-scaled FP8: the values of an FP8 dtype times one power-of-two (E8M0)
  scale per square block, no tensor step (Δ = 1): `mxfp8` (E4M3 elements, 32 x 32 blocks: the MX
  scale, on square blocks) and `e4m3_b128` (E4M3, 128 x 128: DeepSeek-V3's tile, with power-of-two
  scales). Square for the same reason as FP4's; codes held as f32 code · s_blk (exact: a 4-bit
  significand times a power of two), and their GEMMs emulated: no GEMM here takes a scale per block.
The GEMM on two code tensors is chosen by their dtypes (`code_dot_general`): integer x integer is an
int32-accumulated integer GEMM; FP8 x FP8 (float8_e4m3fn, float8_e5m2) a dot on the FP8 operands
with f32 results, which XLA:GPU lowers to an FP8 tensor-core GEMM on Hopper (cuBLASLt's FP8 matmul
or a Triton GEMM with FP8 operands) and XLA:CPU emulates (operands converted to f32, exact); any
other pair (int8 forward codes times FP8 or FP4 gradient codes) is a mixed product no tensor core
runs, emulated exactly in f32 on every platform. So FP8 gradients are native GEMMs only with the
E4M3 forward (an all-FP8 recipe, e.g. `s3r_ec_dx@e5m2+fwd_e4m3`).

A new format is one instance in `_FORMATS` (a new kind of grid: one more subclass of `Format`,
with its `grid`, `capabilities`, `tensor_max`, `round` and, if its GEMM differs, `dot_general`; a
new block-scaled element grid: a subclass of `BlockScaledFormat` with its `element_gap`).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from s3r.quant.grids import E2M1_MAX, E4M3_MAX, block_amax, e2m1_gap, e4m3_ceil, e8m0_ceil, expand_blocks, float_gap

GRIDS = ("uniform", "e2m1", "float", "block_float")  # the `grid` of each Format subclass
BLOCK_SCALES = ("none", "e4m3", "e8m0")  # the per-block scale of a block-scaled grid: E4M3, or a power of two
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.default_backend() names that `Capabilities.native_gemm` lists
__all__ = ["E2M1_MAX", "E4M3_MAX", "block_amax", "expand_blocks"]  # grid helpers, re-exported


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformFormat(Format):
  """The integers in [-qmax, qmax], one real step per scale (int8, int6, int4)."""

  grid: ClassVar[str] = "uniform"
  capabilities: ClassVar[Capabilities] = _INTEGER

  def __post_init__(self):
    super().__post_init__()
    if self.code_dtype.kind not in "iu":
      raise ValueError(f"UniformFormat.code_dtype must be an integer dtype, got {self.code_dtype.name}")

  @property
  def tensor_max(self) -> int:
    return self.qmax

  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """RTNE(v) without a threshold, else the stochastic rounding floor(v + u); then clipped."""
    return self.clip(jnp.round(v) if threshold is None else jnp.floor(v + threshold))


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockScaledFormat(Format):
  """Element values (a small grid up to `qmax`) times one scale per square `block` x `block` block
  (and the per-tensor step, with E4M3 block scales); codes held as f32 code · s_blk, exact, so the
  GEMMs on them are f32 emulations. One subclass per element grid (`element_gap`)."""

  capabilities: ClassVar[Capabilities] = _EMULATED

  code_dtype: np.dtype = np.dtype(np.float32)
  acc_dtype: np.dtype = np.dtype(np.float32)
  block: int  # side of the square blocks that share one scale
  block_scale: str  # "e4m3" (with a per-tensor step) or "e8m0" (without)

  def __post_init__(self):
    super().__post_init__()
    owner = type(self).__name__
    if self.block_scale not in BLOCK_SCALES[1:]:
      raise ValueError(f"{owner}.block_scale must be one of {BLOCK_SCALES[1:]}, got {self.block_scale!r}")
    _check_int(owner, "block", self.block, 1)
    if self.qmax != self.element_max:
      raise ValueError(
        f"{owner}.qmax must be {self.element_max} (the largest {self.element_name} value), got {self.qmax}"
      )
    if self.code_dtype != np.float32:
      raise ValueError(f"{owner}.code_dtype must be float32 (emulated codes), got {self.code_dtype}")

  @property
  @abc.abstractmethod
  def element_max(self) -> int:
    """The largest element value."""

  @property
  @abc.abstractmethod
  def element_name(self) -> str:
    """The element grid's name, for messages."""

  @abc.abstractmethod
  def element_gap(self, w: jax.Array) -> jax.Array:
    """The width hi - lo of the element grid's gap [lo, hi) that holds w in [-qmax, qmax] (a power of
    two, so w / gap is exact)."""

  @property
  def tensor_max(self) -> int | None:
    """qmax · 448 for E4M3 block scales (the largest code times the largest block scale); None for E8M0."""
    return self.qmax * E4M3_MAX if self.block_scale == "e4m3" else None

  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """v divided by its block's scale (`block_scales`) and clipped to [-qmax, qmax]; then in the gap
    [lo, hi) of the element grid that holds w = v / s_blk, with width d = hi - lo, the code is
    d · RTNE(w / d) (ties to the even code), or d · floor(w / d + u): hi exactly when p + u >= 1 for
    p = (w - lo) / d. Returned as code · s_blk (exact in f32), in units of the step."""
    s_blk = expand_blocks(self.block_scales(v), v.shape, self.block)
    w = jnp.clip(v * (jnp.float32(1) / s_blk), -self.qmax, self.qmax)
    gap = self.element_gap(w)
    k = w * (jnp.float32(1) / gap)  # exact: the gap is a power of two
    code = self.clip(gap * (jnp.round(k) if threshold is None else jnp.floor(k + threshold)))
    return code * s_blk

  def block_scales(self, v: jax.Array) -> jax.Array:
    """The scales s_blk [ceil(T/b), ceil(N/b)] of the square b x b blocks of v [..., N] (leading dims
    flattened into T): the smallest E4M3 value (or power of two, E8M0) >= max_blk |v| / qmax, so that
    no element of a block exceeds qmax · s_blk; an all-zero block gets 1, a block holding a NaN or an
    Inf NaN. A partial last block (a dim b does not divide) takes the max over the elements it has."""
    x = block_amax(v, self.block) * np.float32(1.0 / self.qmax)
    s = e4m3_ceil(x) if self.block_scale == "e4m3" else e8m0_ceil(x)
    s = jnp.where(x == 0, jnp.ones_like(s), s)
    return jnp.where(jnp.isfinite(x), s, x)  # NaN for a non-finite block: its codes (code · s_blk) are NaN


@dataclasses.dataclass(frozen=True, kw_only=True)
class E2M1Format(BlockScaledFormat):
  """Block-scaled FP4: E2M1 values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} times a per-block scale (nvfp4, mxfp4)."""

  grid: ClassVar[str] = "e2m1"

  qmax: int = E2M1_MAX

  @property
  def element_max(self) -> int:
    return E2M1_MAX

  @property
  def element_name(self) -> str:
    return "E2M1"

  def element_gap(self, w: jax.Array) -> jax.Array:
    return e2m1_gap(w)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockFloatFormat(BlockScaledFormat):
  """Block-scaled FP8: the finite values of an FP8 dtype (`element_dtype`) times a per-block scale
  (mxfp8, e4m3_b128). The codes are f32 (code · s_blk), not FP8: no platform's GEMM here takes a
  scale per square block, so the GEMMs are emulated."""

  grid: ClassVar[str] = "block_float"

  element_dtype: np.dtype  # the FP8 dtype whose values are the elements (float8_e4m3fn, float8_e5m2)

  def __post_init__(self):
    try:
      dtype = np.dtype(self.element_dtype)
    except TypeError:
      dtype = None
    finfo = jnp.finfo(dtype) if dtype is not None and jnp.issubdtype(dtype, jnp.floating) else None
    if finfo is None or finfo.bits != 8 or float(finfo.min) >= 0:  # E8M0 (unsigned scales) is no element grid
      raise ValueError(f"BlockFloatFormat.element_dtype must be a signed FP8 dtype, got {self.element_dtype!r}")
    object.__setattr__(self, "element_dtype", dtype)
    super().__post_init__()

  @property
  def element_max(self) -> int:
    return int(jnp.finfo(self.element_dtype).max)

  @property
  def element_name(self) -> str:
    return self.element_dtype.name

  def element_gap(self, w: jax.Array) -> jax.Array:
    finfo = jnp.finfo(self.element_dtype)
    return float_gap(w, finfo.nmant, finfo.minexp)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FloatFormat(Format):
  """The finite values of a floating-point code dtype (FP8: float8_e4m3fn, float8_e5m2), one
  per-tensor step that maps max|x| onto the largest of them; codes stored in that dtype."""

  grid: ClassVar[str] = "float"

  acc_dtype: np.dtype = np.dtype(np.float32)

  def __post_init__(self):
    super().__post_init__()
    code = self.code_dtype
    if code.kind in "iu" or code.itemsize >= 4:
      raise ValueError(f"FloatFormat.code_dtype must be a float narrower than float32, got {code.name}")
    if self.qmax != float(jnp.finfo(code).max):
      raise ValueError(
        f"FloatFormat.qmax must be {jnp.finfo(code).max} (the largest finite {code.name}), got {self.qmax}"
      )
    if self.acc_dtype != np.float32:
      raise ValueError(f"FloatFormat.acc_dtype must be float32 (the emulated GEMM's accumulator), got {self.acc_dtype}")

  @property
  def capabilities(self) -> Capabilities:  # pyrefly: ignore[bad-override]
    """Native on CUDA (Hopper's FP8 tensor cores) for float8_e4m3fn and float8_e5m2 codes with FP8
    partner codes (`code_dot_general`); emulated for any other float dtype."""
    return _FP8 if self.code_dtype in NATIVE_FP8_DTYPES else _EMULATED

  @property
  def mantissa_bits(self) -> int:
    """Stored mantissa bits of the code dtype (3 for E4M3, 2 for E5M2)."""
    return jnp.finfo(self.code_dtype).nmant

  @property
  def min_exponent(self) -> int:
    """The exponent of the smallest normal value (-6 for E4M3, -14 for E5M2)."""
    return jnp.finfo(self.code_dtype).minexp

  @property
  def tensor_max(self) -> int:
    return self.qmax

  def round(self, v: jax.Array, threshold: jax.Array | None = None) -> jax.Array:
    """v clipped to [-Q, Q]; in the gap [lo, hi) of the grid that holds it, of width d = hi - lo (a
    power of two: the spacing of its binade, `grids.float_gap`), the code is d · RTNE(v / d) (the
    nearest value, ties to the even mantissa) or d · floor(v / d + u): hi exactly when p + u >= 1
    for p = (v - lo) / d. Stored in code_dtype, exactly."""
    w = jnp.clip(v, -self.qmax, self.qmax)
    gap = float_gap(w, self.mantissa_bits, self.min_exponent)
    k = w * (jnp.float32(1) / gap)  # exact: the gap is a power of two
    return self.clip(gap * (jnp.round(k) if threshold is None else jnp.floor(k + threshold)))


def _uniform(name: str, qmax: int) -> UniformFormat:
  return UniformFormat(name=name, qmax=qmax, code_dtype=np.dtype(np.int8), acc_dtype=np.dtype(np.int32))


def _fp8(name: str, dtype) -> FloatFormat:
  return FloatFormat(name=name, qmax=int(jnp.finfo(dtype).max), code_dtype=np.dtype(dtype))


def _block_fp8(name: str, dtype, *, block: int) -> BlockFloatFormat:
  """FP8 elements with a power-of-two (E8M0) scale per square block, no tensor step."""
  qmax = int(jnp.finfo(dtype).max)
  return BlockFloatFormat(name=name, qmax=qmax, element_dtype=np.dtype(dtype), block=block, block_scale="e8m0")


INT8 = _uniform("int8", 127)
FORWARD_FORMAT = INT8  # the forward's activation and weight codes (the default `Recipe.forward_format`)
FORWARD_FORMATS = ("int8", "e4m3")  # the formats a recipe's forward may quantize into (`Recipe.forward_format`)

_FORMATS: tuple[Format, ...] = (
  INT8,
  _uniform("int6", 31),
  _uniform("int4", 7),
  E2M1Format(name="nvfp4", block=16, block_scale="e4m3"),
  E2M1Format(name="mxfp4", block=32, block_scale="e8m0"),
  _fp8("e4m3", jnp.float8_e4m3fn),
  _fp8("e5m2", jnp.float8_e5m2),
  _block_fp8("mxfp8", jnp.float8_e4m3fn, block=32),
  _block_fp8("e4m3_b128", jnp.float8_e4m3fn, block=128),
)


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


def formats_with(capability: str) -> tuple[str, ...]:
  """The registered format names whose `Capabilities` field `capability` is true (non-empty)."""
  return tuple(n for n, f in FORMATS.items() if getattr(f.capabilities, capability))


def accumulator(dtype) -> np.dtype:
  """The accumulator dtype of a GEMM on operands of `dtype`: that of the formats whose codes are
  stored in it, f32 for any other (float) operand."""
  return _ACCUMULATORS.get(np.dtype(dtype), np.dtype(np.float32))
