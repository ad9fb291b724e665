"""Block-scaled codes: a small element grid times one scale per square block (FP4: E2M1; FP8 elements
with power-of-two scales), held as f32 code · s_blk, so that their GEMMs are exact f32 emulations."""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant.formats.base import _EMULATED, BLOCK_SCALES, Capabilities, Format, _check_int
from s3r.quant.grids import E2M1_MAX, E4M3_MAX, block_amax, e2m1_gap, e4m3_ceil, e8m0_ceil, expand_blocks, float_gap


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
