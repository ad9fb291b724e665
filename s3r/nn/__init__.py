"""Flax adapters: s3r's quantized matmul as a `dot_general` for Linen and NNX layers, `quantize`,
and `GroupedLinear` (the expert-sorted grouped matmul as an NNX layer); `quantize_fn` for any JAX
function (plain JAX, Equinox), with its `Rule`, `Site` and `sites`."""

from s3r.nn.dot_general import LinenDotGeneral, NnxDotGeneral, check_keys, dot_general, kernel_fingerprint
from s3r.nn.grouped import GroupedLinear
from s3r.nn.intercept import Rule, Site, quantize_fn, sites
from s3r.nn.quantize import NnxEinsumOp, QuantizedLinen, einsum, quantize

__all__ = [
  "GroupedLinear",
  "LinenDotGeneral",
  "NnxDotGeneral",
  "NnxEinsumOp",
  "QuantizedLinen",
  "Rule",
  "Site",
  "check_keys",
  "dot_general",
  "einsum",
  "kernel_fingerprint",
  "quantize",
  "quantize_fn",
  "sites",
]
