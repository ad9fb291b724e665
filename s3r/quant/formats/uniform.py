"""Uniform integer codes: the integers in [-Q, Q] with one per-tensor step (int8, int6, int4)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from s3r.quant.formats.base import _INTEGER, Capabilities, Format


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
