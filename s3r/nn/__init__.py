"""Flax adapters: s3r's quantized matmul as a `dot_general` for Linen `Dense` and `nnx.Linear`."""
from s3r.nn.dot_general import LinenDotGeneral, NnxDotGeneral, dot_general
from s3r.nn.grouped import GroupedLinear
