"""Floating-point codes: the finite values of an FP8 dtype with one per-tensor step (e4m3, e5m2)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant.formats.base import _EMULATED, _FP8, NATIVE_FP8_DTYPES, Capabilities, Format
from s3r.quant.grids import float_gap


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
