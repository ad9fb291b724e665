"""Integrations of s3r into other JAX training frameworks (optional: each imports its framework lazily).

- `s3r.integrations.maxtext`: s3r as a MaxText quantization backend (`quantization=s3r` or
  `quantization=s3r:RECIPE`), installed with the extra `s3r[maxtext]`.
"""
