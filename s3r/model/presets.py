"""Presets of the five decoder families, `preset()` and parameter counts.

Presets: published dimensions (references in docs/models.md), CPU-sized siblings of each
family, and the original toy presets. `params` is the total, `active` the parameters one
token uses (all but the routed experts it is not sent to); both checked in tests/model.

| preset             | family      | layers | width | params          | active         |
|--------------------|-------------|--------|-------|-----------------|----------------|
| `tiny`             | llama       | 2      | 64    | 164,160         | 164,160        |
| `cpu-small`        | llama       | 4      | 192   | 4,720,320       | 4,720,320      |
| `paper-12l`        | llama       | 12     | 768   | 134,105,856     | 134,105,856    |
| `llama3.1-8b`      | llama       | 32     | 4096  | 8,030,261,248   | 8,030,261,248  |
| `qwen3-8b`         | qwen3       | 36     | 4096  | 8,190,735,360   | 8,190,735,360  |
| `gemma3-12b`       | gemma3      | 48     | 3840  | 11,766,034,176  | 11,766,034,176 |
| `qwen3-30b-a3b`    | qwen3_moe   | 48     | 2048  | 30,532,122,624  | 3,353,032,704  |
| `deepseek-v2-lite` | deepseek_v2 | 27     | 2048  | 15,706,484,224  | 2,661,150,208  |
| `llama-tiny`       | llama       | 2      | 64    | 164,160         | 164,160        |
| `qwen3-tiny`       | qwen3       | 2      | 64    | 164,224         | 164,224        |
| `gemma3-tiny`      | gemma3      | 6      | 64    | 329,664         | 329,664        |
| `qwen3-moe-tiny`   | qwen3_moe   | 2      | 64    | 288,128         | 140,672        |
| `deepseek-tiny`    | deepseek_v2 | 3      | 64    | 320,544         | 209,952        |
| `moe-tiny`         | qwen3_moe   | 2      | 64    | 152,448         | 127,872        |
| `moe-cpu-small`    | qwen3_moe   | 4      | 192   | 6,864,832       | 4,652,992      |

`moe-tiny` (tests) and `moe-cpu-small` (CPU experiments) are the MoE training presets: Qwen3-MoE
blocks with top-2 of 8 (tiny: 4) routed experts and one shared expert; `moe-cpu-small` has
`cpu-small`'s attention, embeddings and depth, and its active expert width (3 x 160) is close
to `cpu-small`'s d_ff = 512, so that a step costs about the same (docs/moe.md).
`cpu-small` is sized for CPU experiments (a `s3r_ec_dx` step at batch 8 x seq 256 takes about
a second on two cores; the vocabulary-sized embedding and logits hold two thirds of its
parameters). `paper-12l` is the paper's 12-layer Llama-style decoder; the paper does not state
its vocabulary or FFN width, so 32000 (Llama tokenizer) and d_ff = 8/3 * width are assumed.
The CLI may replace `vocab_size` by the tokenizer's; the counts above are at each preset's own.
"""

from __future__ import annotations

import dataclasses

from s3r.model.config import (
  DeepSeekV2Config,
  Gemma3Config,
  ModelConfig,
  MoeFields,
  Qwen3Config,
  Qwen3MoeConfig,
  RopeScaling,
)

_LLAMA3_ROPE = RopeScaling(
  kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192
)
_DEEPSEEK_YARN = RopeScaling(
  kind="yarn", factor=40.0, original_max_seq_len=4096, beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707
)
_TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=128)

PRESETS: dict[str, ModelConfig] = {
  "tiny": ModelConfig(**_TINY),
  "cpu-small": ModelConfig(
    vocab_size=8192, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512, max_seq_len=256
  ),
  "paper-12l": ModelConfig(
    vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048, max_seq_len=2048
  ),
  # Published dimensions (config.json of each model; see docs/models.md).
  "llama3.1-8b": ModelConfig(
    vocab_size=128256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    d_ff=14336,
    max_seq_len=131072,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_ROPE,
    norm_eps=1e-5,
  ),
  "qwen3-8b": Qwen3Config(
    vocab_size=151936,
    d_model=4096,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    d_head=128,
    d_ff=12288,
    max_seq_len=40960,
    rope_theta=1_000_000.0,
  ),
  "gemma3-12b": Gemma3Config(
    vocab_size=262208,
    d_model=3840,
    n_layers=48,
    n_heads=16,
    n_kv_heads=8,
    d_head=256,
    d_ff=15360,
    max_seq_len=131072,
    rope_theta=1_000_000.0,
    rope_scaling=RopeScaling(kind="linear", factor=8.0),
    sliding_window=1024,
    local_rope_theta=10_000.0,
    query_pre_attn_scalar=256.0,
  ),
  "qwen3-30b-a3b": Qwen3MoeConfig(
    vocab_size=151936,
    d_model=2048,
    n_layers=48,
    n_heads=32,
    n_kv_heads=4,
    d_head=128,
    d_ff=6144,
    max_seq_len=40960,
    rope_theta=1_000_000.0,
    n_experts=128,
    top_k=8,
    d_expert=768,
    renormalize=True,
  ),
  "deepseek-v2-lite": DeepSeekV2Config(
    vocab_size=102400,
    d_model=2048,
    n_layers=27,
    n_heads=16,
    n_kv_heads=16,
    d_ff=10944,
    max_seq_len=163840,
    rope_scaling=_DEEPSEEK_YARN,
    n_experts=64,
    top_k=6,
    d_expert=1408,
    n_shared=2,
    dense_layers=1,
    renormalize=False,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
  ),
  # CPU-sized siblings (tests, CPU training): each family's structure at width 64.
  "llama-tiny": ModelConfig(
    **_TINY, rope_theta=500_000.0, rope_scaling=RopeScaling(kind="llama3", factor=8.0, original_max_seq_len=32)
  ),
  "qwen3-tiny": Qwen3Config(**{**_TINY, "d_head": 16}, rope_theta=1_000_000.0),
  "gemma3-tiny": Gemma3Config(
    **{**_TINY, "n_layers": 6, "d_head": 32, "d_ff": 128},
    rope_theta=1_000_000.0,
    rope_scaling=RopeScaling(kind="linear", factor=8.0),
    sliding_window=16,
    query_pre_attn_scalar=32.0,
  ),
  "qwen3-moe-tiny": Qwen3MoeConfig(
    **{**_TINY, "d_head": 16}, rope_theta=1_000_000.0, n_experts=8, top_k=2, d_expert=64
  ),
  "deepseek-tiny": DeepSeekV2Config(
    **{**_TINY, "n_layers": 3, "n_kv_heads": 4},
    rope_scaling=RopeScaling(kind="yarn", factor=4.0, original_max_seq_len=32, mscale=0.707, mscale_all_dim=0.707),
    n_experts=8,
    top_k=2,
    d_expert=48,
    n_shared=1,
    dense_layers=1,
    renormalize=False,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
  ),
  # MoE training presets: Qwen3-MoE blocks with one shared expert; moe-cpu-small costs about what
  # cpu-small costs per step (top-2 + shared = 3 x 160 active expert units against d_ff = 512).
  "moe-tiny": Qwen3MoeConfig(**{**_TINY, "d_head": 16}, n_experts=4, top_k=2, d_expert=32, n_shared=1),
  "moe-cpu-small": Qwen3MoeConfig(
    vocab_size=8192,
    d_model=192,
    n_layers=4,
    n_heads=6,
    n_kv_heads=2,
    d_ff=512,
    max_seq_len=256,
    n_experts=8,
    top_k=2,
    d_expert=160,
    n_shared=1,
  ),
}
"""The model presets by name (`s3r train --preset`, `preset(name)`): small shapes for the CPU and the
shapes of the released models."""
OVERRIDES = {"layers": "n_layers", "seq": "max_seq_len", "width": "d_model"}  # short names accepted by preset()


def preset(name: str, **overrides) -> ModelConfig:
  """The preset `name` with fields replaced by `overrides`: any config field (vocab_size, recipe, ...) or
  the short names layers (n_layers), seq (max_seq_len) and width (d_model; a family with its own d_head keeps it)."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
  base = PRESETS[name]
  fields = {OVERRIDES.get(k, k): v for k, v in overrides.items()}
  if isinstance(base, MoeFields) and "n_layers" in fields:
    fields.setdefault("dense_layers", min(base.dense_layers, fields["n_layers"]))
  return dataclasses.replace(base, **fields)


def param_count(cfg: ModelConfig) -> int:
  """Number of trainable parameters (from the config's arithmetic; equals the initialized shapes)."""
  return _counts(cfg)[0]


def active_param_count(cfg: ModelConfig) -> int:
  """Parameters one token uses: all but the routed experts it is not sent to (embeddings included)."""
  return _counts(cfg)[1]


def _counts(cfg: ModelConfig) -> tuple[int, int]:
  embed = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.d_model  # + final norm
  total = active = embed
  for layer in range(cfg.n_layers):
    ffn_total, ffn_active = cfg.ffn_params(layer)
    shared = cfg.attention_params() + cfg.norm_params()
    total, active = total + shared + ffn_total, active + shared + ffn_active
  return total, active
