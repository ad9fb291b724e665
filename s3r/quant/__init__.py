"""Numerics, thresholds, recipes and the custom-VJP quantized matmul (imports jax and numpy only)."""

from s3r.quant.grouped import grouped_qmatmul
from s3r.quant.matmul import gradient_codes, qmatmul, quantize_gradient
from s3r.quant.recipes import DEFAULT_RECIPE, DIAGNOSTIC_RECIPES, RECIPES, Recipe, recipe

__all__ = [
  "DEFAULT_RECIPE",
  "DIAGNOSTIC_RECIPES",
  "RECIPES",
  "Recipe",
  "gradient_codes",
  "grouped_qmatmul",
  "qmatmul",
  "quantize_gradient",
  "recipe",
]
