"""Number formats of the quantized codes: one class per kind of grid, and the registry of formats.

The interface is `base.py` (`Format`, `Capabilities`, `code_dot_general`); each kind of grid is a
module beside it (`uniform.py`, `block_scaled.py`, `floating.py`); this module holds the registered
instances and the look-ups (`get_format`, `formats_with`, `accumulator`).

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

A new format is one instance in `_FORMATS` (a new kind of grid: one more subclass of `Format`, in a module of its own,
with its `grid`, `capabilities`, `tensor_max`, `round` and, if its GEMM differs, `dot_general`; a
new block-scaled element grid: a subclass of `BlockScaledFormat` with its `element_gap`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from s3r.quant.formats.base import (
  BLOCK_SCALES,
  GRIDS,
  NATIVE_FP8_DTYPES,
  PLATFORMS,
  Capabilities,
  Format,
  code_dot_general,
)
from s3r.quant.formats.block_scaled import BlockFloatFormat, BlockScaledFormat, E2M1Format
from s3r.quant.formats.floating import FloatFormat
from s3r.quant.formats.uniform import UniformFormat
from s3r.quant.grids import E2M1_MAX, E4M3_MAX, block_amax, expand_blocks

__all__ = [
  "BLOCK_SCALES",
  "E2M1_MAX",
  "E4M3_MAX",
  "FORMATS",
  "FORWARD_FORMAT",
  "FORWARD_FORMATS",
  "GRIDS",
  "INT8",
  "NATIVE_FP8_DTYPES",
  "PLATFORMS",
  "BlockFloatFormat",
  "BlockScaledFormat",
  "Capabilities",
  "E2M1Format",
  "FloatFormat",
  "Format",
  "UniformFormat",
  "accumulator",
  "block_amax",
  "code_dot_general",
  "expand_blocks",
  "formats_with",
  "get_format",
]


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
