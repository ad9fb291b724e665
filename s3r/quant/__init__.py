"""Numerics, thresholds, recipes and the custom-VJP quantized matmul (imports jax and numpy only)."""
from s3r.quant.recipes import RECIPES, DIAGNOSTIC_RECIPES, Recipe, recipe
from s3r.quant.qmatmul import qmatmul
