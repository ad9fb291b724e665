"""The S3R paper's reference numbers and shapes, in one place (docs/algorithm.md §3, paper Tables I-IV).

Shapes: H is the model width, D_ffn the FFN hidden width of a SwiGLU block (W1..W9, Table III).
Nothing here is measured: results files and tables print these values next to our measurements.
"""

from __future__ import annotations

# The FFN shapes (H, D_ffn) of Table III.
FFN_SHAPES: dict[str, tuple[int, int]] = {
    "W1": (512, 2048), "W2": (1024, 4096), "W3": (2048, 8192), "W4": (3072, 12288),
    "W5": (3840, 15360), "W6": (4096, 12288), "W7": (4096, 14336), "W8": (5120, 17920),
    "W9": (8192, 28672),
}  # fmt: skip

# Table I: final validation loss (mean over seeds). A difference between two recipes is taken from these,
# not from the gaps above, which the paper rounded from unrounded means (5.094 - 5.002 = 0.092, as its
# text says, where 0.202 - 0.109 would give 0.093).
PAPER_LOSS: dict[str, float] = {
    "bf16": 4.892, "int8_rtne": 5.106, "int8_sr": 4.929, "s3r": 5.055, "s3r_ec_dx": 4.924, "s3r_ec": 4.919,
    "s3r_bcast": 6.239, "s3r_ec_dx_bcast": 5.094, "s3r_ec_bcast": 5.002,
}  # fmt: skip


def paper_diff(a: str, b: str) -> float | None:
  """The paper's Table I difference a - b in final validation loss (None where it has no row for one)."""
  if a not in PAPER_LOSS or b not in PAPER_LOSS:
    return None
  return round(PAPER_LOSS[a] - PAPER_LOSS[b], 3)


# Table III (one SwiGLU FFN block fwd+bwd on TPU v5p): speed vs BF16 for INT8 RTNE, independent
# SR and S3R, and the S3R-EC overheads in % of the S3R time.
PAPER_TABLE_III: dict[str, dict[str, float]] = {
  "W1": {"int8_rtne": 1.12, "int8_sr": 0.58, "s3r": 1.08, "s3r_ec_pct": 13.0, "s3r_ec_dx_pct": 14.8},
  "W2": {"int8_rtne": 1.45, "int8_sr": 0.91, "s3r": 1.44, "s3r_ec_pct": 7.3, "s3r_ec_dx_pct": 9.6},
  "W3": {"int8_rtne": 1.73, "int8_sr": 1.29, "s3r": 1.73, "s3r_ec_pct": -0.6, "s3r_ec_dx_pct": 1.7},
  "W4": {"int8_rtne": 1.92, "int8_sr": 1.54, "s3r": 1.92, "s3r_ec_pct": 4.8, "s3r_ec_dx_pct": 4.1},
  "W5": {"int8_rtne": 1.84, "int8_sr": 1.53, "s3r": 1.83, "s3r_ec_pct": 2.8, "s3r_ec_dx_pct": 3.3},
  "W6": {"int8_rtne": 1.89, "int8_sr": 1.60, "s3r": 1.90, "s3r_ec_pct": 2.7, "s3r_ec_dx_pct": 3.1},
  "W7": {"int8_rtne": 1.87, "int8_sr": 1.56, "s3r": 1.87, "s3r_ec_pct": 3.4, "s3r_ec_dx_pct": 3.1},
  "W8": {"int8_rtne": 1.82, "int8_sr": 1.58, "s3r": 1.81, "s3r_ec_pct": 0.7, "s3r_ec_dx_pct": 2.7},
  "W9": {"int8_rtne": 1.81, "int8_sr": 1.66, "s3r": 1.81, "s3r_ec_pct": 3.8, "s3r_ec_dx_pct": 2.2},
}

# Extra TPU v5p VPU operations per gradient element over INT8 RTNE (§3): (low, high) over the shapes.
PAPER_EXTRA_OPS: dict[str, tuple[int, int]] = {"int8_sr": (120, 133), "s3r": (-2, 6), "s3r_ec": (15, 23)}

# Table I (12-layer Llama, C4, 2000 steps): final validation loss gap to BF16.
PAPER_GAP: dict[str, float] = {
    "bf16": 0.0, "int8_rtne": 0.214, "int8_sr": 0.037, "s3r": 0.163, "s3r_ec_dx": 0.032, "s3r_ec": 0.027,
    "s3r_bcast": 1.347, "s3r_ec_dx_bcast": 0.202, "s3r_ec_bcast": 0.109,
}  # fmt: skip

# Table II (12-layer Llama on C4): relative gradient error of dX layer 0, dX layer 11, dW layer 0
# and the embedding gradient.
PAPER_TABLE2: dict[str, tuple[float, float, float, float]] = {
  "int8_sr": (0.572, 0.111, 0.456, 0.457),
  "s3r": (0.877, 0.228, 0.691, 0.703),
  "s3r_ec_dw": (0.882, 0.228, 0.694, 0.706),
  "s3r_ec": (0.476, 0.103, 0.377, 0.378),
  "s3r_bcast": (3.157, 0.313, 5.141, 5.285),
  "s3r_ec_dw_bcast": (3.150, 0.313, 4.529, 5.262),
  "s3r_ec_bcast": (0.521, 0.105, 0.551, 0.558),
  "s3r_split_dx2d_dwbcast": (0.893, 0.227, 0.746, 0.714),
  "s3r_split_dxbcast_dw2d": (3.494, 0.261, 5.979, 6.849),
}

# The paper's two MoE models (Table IV) as MoE feed-forward block shapes: model width H, routed
# experts E, experts per token k, expert width F, always-active shared experts of width F each.
MOE_SHAPES: dict[str, dict[str, int]] = {
  "qwen3-30b-a3b": {"hidden": 2048, "experts": 128, "top_k": 8, "expert_width": 768, "shared": 0},
  "deepseek-v2-lite": {"hidden": 2048, "experts": 64, "top_k": 6, "expert_width": 1408, "shared": 2},
}

# Table IV (full MaxText training steps on TPU v5p, FSDP x TP mesh, 4 sequences of 4096 tokens per
# chip, full rematerialization, flash attention): median step time in ms per model and recipe.
PAPER_TABLE_IV_MODELS: tuple[str, ...] = (
  "llama3.1-8b", "qwen3-8b", "gemma3-12b", "qwen3-30b-a3b", "deepseek-v2-lite",
)  # fmt: skip
PAPER_TABLE_IV_MS: dict[str, dict[str, float]] = {
    "bf16": {"llama3.1-8b": 3862, "qwen3-8b": 4018, "gemma3-12b": 6550, "qwen3-30b-a3b": 6454,
             "deepseek-v2-lite": 3659},
    "int8_rtne": {"llama3.1-8b": 2926, "qwen3-8b": 3110, "gemma3-12b": 4822, "qwen3-30b-a3b": 7305,
                  "deepseek-v2-lite": 3842},
    "int8_sr": {"llama3.1-8b": 3350, "qwen3-8b": 3607, "gemma3-12b": 5526, "qwen3-30b-a3b": 7914,
                "deepseek-v2-lite": 4269},
    "s3r": {"llama3.1-8b": 2903, "qwen3-8b": 3104, "gemma3-12b": 4853, "qwen3-30b-a3b": 7286, "deepseek-v2-lite": 3840},
    "s3r_ec": {"llama3.1-8b": 3008, "qwen3-8b": 3243, "gemma3-12b": 4961, "qwen3-30b-a3b": 7621,
               "deepseek-v2-lite": 4029},
    "s3r_ec_dx": {"llama3.1-8b": 2935, "qwen3-8b": 3160, "gemma3-12b": 4911, "qwen3-30b-a3b": 7548,
                  "deepseek-v2-lite": 3984},
}  # fmt: skip
# The Table IV model each s3r model family is measured against (the CPU siblings share their family's column).
PAPER_TABLE_IV_FAMILY: dict[str, str] = {
  "llama": "llama3.1-8b", "qwen3": "qwen3-8b", "gemma3": "gemma3-12b", "qwen3_moe": "qwen3-30b-a3b",
  "deepseek_v2": "deepseek-v2-lite",
}  # fmt: skip
# The MoE models' columns of Table IV, by model then recipe.
PAPER_TABLE_IV_MOE_MS: dict[str, dict[str, float]] = {
  model: {recipe: times[model] for recipe, times in PAPER_TABLE_IV_MS.items()} for model in MOE_SHAPES
}
