"""The quantized backward pass shared by the dense (matmul.py) and grouped (grouped/matmul.py) layers.

Both layers' custom VJPs run the same steps on their own layout of the upstream gradient: quantize
the scaled gradient G' into codes Q (one step Δ, the recipe's rounding and threshold topology),
take S3R-EC's factors of the known rounding error e = Q - G'/Δ when the recipe corrects a product,
then the two GEMMs on codes, dX = (Δ/s_x)(Q Ŵᵀ - correction) and dW = (Δ/s_w)(X̂ᵀ Q - correction).
A `GradientLayout` supplies each step for its layout (dense [B, S, N] with optional tensor
parallelism; expert-sorted rows with per-segment corrections); `quantized_backward` is the one
sequence of them.
"""

from __future__ import annotations

from typing import Protocol

import jax

from s3r.quant import ec, formats
from s3r.quant.recipes import Recipe


class GradientLayout(Protocol):
  """One layer's layout of the backward pass (see `quantized_backward`)."""

  def quantize(self, recipe: Recipe, key: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(Δ, G'/Δ, Q for dX, Q for dW): the scaled gradient's step and codes (one Q twice unless split)."""
    ...

  def error_factors(self, e: jax.Array, /) -> ec.Factors:
    """S3R-EC's factors (row, column and grand means per example or segment) of the error e."""
    ...

  def dx(self, q_dx: jax.Array, delta: jax.Array, factors: ec.Factors | None, /) -> jax.Array:
    """dX from Q, corrected with `factors` when given."""
    ...

  def dw(self, q_dw: jax.Array, delta: jax.Array, factors: ec.Factors | None, /) -> jax.Array:
    """dW from Q, corrected with `factors` when given."""
    ...


def quantized_backward(recipe: Recipe, layout: GradientLayout, key: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(dX, dW) of a recipe that quantizes the gradient, in `layout`."""
  delta, v, q_dx, q_dw = layout.quantize(recipe, key)
  factors = None
  if recipe.correct_dx or recipe.correct_dw:
    # e = Q - G'/Δ in units of Δ (EC recipes never split: q_dx is q_dw); for the block-scaled grids
    # Q = code · s_blk, so e = (s_t · s_blk · code - G') / s_t exactly
    factors = layout.error_factors(formats.get_format(recipe.grad_format).dequantize(q_dx) - v)
  dx = layout.dx(q_dx, delta, factors if recipe.correct_dx else None)
  dw = layout.dw(q_dw, delta, factors if recipe.correct_dw else None)
  return dx, dw
