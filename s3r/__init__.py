"""s3r: fast, unbiased INT8 quantized training for JAX (S3R and S3R-EC)."""
from s3r.quant import DIAGNOSTIC_RECIPES, RECIPES, Recipe, gradient_codes, grouped_qmatmul, qmatmul, recipe

__version__ = "0.1.0"
__all__ = ["DIAGNOSTIC_RECIPES", "RECIPES", "Recipe", "gradient_codes", "grouped_qmatmul", "qmatmul", "recipe", "__version__"]
