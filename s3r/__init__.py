"""s3r: unbiased INT8 quantized training for JAX (S3R and S3R-EC)."""

from s3r.quant import (
  DEFAULT_RECIPE,
  DIAGNOSTIC_RECIPES,
  RECIPES,
  Recipe,
  gradient_codes,
  grouped_qmatmul,
  qmatmul,
  recipe,
)

__version__ = "0.1.0"
"""The installed version of s3r."""
__all__ = [
  "DEFAULT_RECIPE",
  "DIAGNOSTIC_RECIPES",
  "RECIPES",
  "Recipe",
  "gradient_codes",
  "grouped_qmatmul",
  "nn",
  "qmatmul",
  "recipe",
  "__version__",
]


def __getattr__(name):
  """`s3r.nn` (the Flax adapters) is imported on first use, so `import s3r` does not import Flax."""
  if name == "nn":
    import importlib

    return importlib.import_module("s3r.nn")
  raise AttributeError(f"module 's3r' has no attribute {name!r}")
