"""Model configuration, presets and parameter count.

Presets (parameter counts computed by `param_count`, checked in tests/model/test_model.py):

| preset      | layers | width | heads (q/kv) | d_ff | vocab | max seq | parameters  |
|-------------|--------|-------|--------------|------|-------|---------|-------------|
| `tiny`      | 2      | 64    | 4 / 2        | 192  | 512   | 128     | 164,160     |
| `cpu-small` | 4      | 192   | 6 / 2        | 512  | 8192  | 256     | 4,720,320   |
| `paper-12l` | 12     | 768   | 12 / 12      | 2048 | 32000 | 2048    | 134,105,856 |

`cpu-small` is sized for CPU experiments: a `s3r_ec_dx` training step at batch 8 x seq 256
took 0.4-0.75 s on the two cores of the development machine at load ~2.5 and a median of 1.0 s
at load ~5 (the vocabulary-sized embedding and logits hold two thirds of its parameters).
The vocabulary of a training run is the tokenizer's (`s3r train --vocab`), so the CLI
replaces `vocab_size`; the counts above are at the preset's own vocabulary. `paper-12l`
is the paper's 12-layer Llama-style decoder; the paper does not state its vocabulary or
FFN width, so 32000 (Llama tokenizer) and the Llama ratio d_ff = 8/3 * width are assumed.
"""

from __future__ import annotations

import dataclasses

from s3r.quant import RECIPES

TP_PARTIAL_SUMS = ("bf16", "int32")  # how tensor-parallel partial sums are reduced (see ModelConfig)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Shape and numerics of the Llama-style decoder."""

  vocab_size: int = 8192  # tokenizer vocabulary (embedding rows, logits)
  d_model: int = 192  # residual stream width D
  n_layers: int = 4  # number of transformer blocks
  n_heads: int = 6  # query heads N; head dim H = d_model // n_heads
  n_kv_heads: int = 2  # key/value heads K (grouped-query attention); divides n_heads
  d_ff: int = 512  # SwiGLU hidden width F
  max_seq_len: int = 256  # longest sequence the model accepts
  rope_theta: float = 10_000.0  # RoPE base frequency
  norm_eps: float = 1e-6  # RMSNorm epsilon
  init_std: float = 0.02  # std of the normal init of all matrices (o/down: / sqrt(2 * n_layers))
  recipe: str = "s3r_ec_dx"  # quantization recipe of the seven block projections (s3r.quant.RECIPES)
  remat: bool = False  # rematerialize each block in the backward pass (saves activation memory)
  tp_partial_sums: str = "bf16"  # tensor parallelism: "bf16" rounds each shard's GEMM output (the paper), "int32" sums exactly

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
    if self.d_model % self.n_heads:
      raise ValueError(f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"ModelConfig.n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig head dim d_model // n_heads must be even for RoPE, got {self.head_dim}")
    for field in ("rope_theta", "norm_eps", "init_std"):
      if not getattr(self, field) > 0:
        raise ValueError(f"ModelConfig.{field} must be > 0, got {getattr(self, field)!r}")
    if self.recipe not in RECIPES:
      raise ValueError(f"ModelConfig.recipe must be one of {', '.join(RECIPES)}; got {self.recipe!r}")
    if self.tp_partial_sums not in TP_PARTIAL_SUMS:
      raise ValueError(f"ModelConfig.tp_partial_sums must be one of {', '.join(TP_PARTIAL_SUMS)}; "
                       f"got {self.tp_partial_sums!r}")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "ModelConfig":
    return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                        max_seq_len=128),
    "cpu-small": ModelConfig(vocab_size=8192, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512,
                             max_seq_len=256),
    "paper-12l": ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12,
                             d_ff=2048, max_seq_len=2048),
}


def preset(name: str, **overrides) -> ModelConfig:
  """The preset called `name` with fields replaced by `overrides` (e.g. vocab_size, recipe)."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
  return dataclasses.replace(PRESETS[name], **overrides)


def param_count(cfg: ModelConfig) -> int:
  """Number of trainable parameters (embedding and output projection are untied)."""
  d, h = cfg.d_model, cfg.head_dim
  attention = d * (cfg.n_heads * h) * 2 + d * (cfg.n_kv_heads * h) * 2  # q, o + k, v
  mlp = 3 * d * cfg.d_ff  # gate, up, down
  block = attention + mlp + 2 * d  # + two RMSNorm scales
  return 2 * cfg.vocab_size * d + cfg.n_layers * block + d  # + final RMSNorm
