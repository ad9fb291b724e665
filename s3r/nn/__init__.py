"""Flax adapters: s3r's quantized matmul as a `dot_general` for Linen and NNX layers, `quantize`,
and `GroupedLinear` (the expert-sorted grouped matmul as an NNX layer)."""

from s3r.nn.dot_general import LinenDotGeneral, NnxDotGeneral, check_keys, dot_general, kernel_fingerprint
from s3r.nn.grouped import GroupedLinear
from s3r.nn.quantize import NnxEinsumOp, QuantizedLinen, einsum, quantize

__all__ = [
  "GroupedLinear",
  "LinenDotGeneral",
  "NnxDotGeneral",
  "NnxEinsumOp",
  "QuantizedLinen",
  "check_keys",
  "dot_general",
  "einsum",
  "kernel_fingerprint",
  "quantize",
]
