"""The grouped (mixture-of-experts) quantized matmul and its numerics, for expert-sorted rows.

`matmul.py` is the custom-VJP layer (`grouped_qmatmul`, `GlobalRows` for rows sharded over a
mesh); `gemm.py` the grouped GEMMs (tiled, ragged and Pallas implementations behind one
interface); `pallas.py` the Pallas kernels with their fused epilogue; `ec.py` S3R-EC with one
expert's segment as the example.
"""

from s3r.quant.grouped.matmul import DEFAULT_IMPL, GlobalRows, grouped_qmatmul, quantize_grouped_gradient

__all__ = ["DEFAULT_IMPL", "GlobalRows", "grouped_qmatmul", "quantize_grouped_gradient"]
