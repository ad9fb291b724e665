"""s3r: fast, unbiased INT8 quantized training for JAX (S3R and S3R-EC)."""
from s3r.quant import RECIPES, DIAGNOSTIC_RECIPES, Recipe, qmatmul, recipe

__version__ = "0.1.0"
