"""Llama 3: GQA with RoPE (Llama 3 band-wise, linear or YaRN scaling), SwiGLU (`LlamaForCausalLM`).

The config is the shared base `s3r.model.config.ModelConfig` and the block the shared Llama block
`s3r.model.layers.Block`; this module holds the Hugging Face conversion and the presets. `params` is
the total, `active` the parameters one token uses (checked in tests/model):

| preset             | layers | width | params          | active         |
|--------------------|--------|-------|-----------------|----------------|
| `tiny`             | 2      | 64    | 164,160         | 164,160        |
| `cpu-small`        | 4      | 192   | 4,720,320       | 4,720,320      |
| `paper-12l`        | 12     | 768   | 134,105,856     | 134,105,856    |
| `llama3.1-8b`      | 32     | 4096  | 8,030,261,248   | 8,030,261,248  |
| `llama-tiny`       | 2      | 64    | 164,160         | 164,160        |

`cpu-small` is sized for CPU experiments (a `s3r_ec_dx` step at batch 8 x seq 256 takes about
a second on two cores; the vocabulary-sized embedding and logits hold two thirds of its
parameters). `paper-12l` is the paper's 12-layer Llama-style decoder; the paper does not state
its vocabulary or FFN width, so 32000 (Llama tokenizer) and d_ff = 8/3 * width are assumed.
`llama3.1-8b` has the published dimensions (docs/models.md); `llama-tiny` is its structure at
width 64, and `tiny` the original toy model. `TINY` holds the width-64 shape the other families'
CPU-sized presets start from.
"""

from __future__ import annotations

from s3r.model.config import ModelConfig, RopeScaling
from s3r.model.families.base import Family
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, rope, rope_parameters, write_common
from s3r.model.layers import Block


def read(f: Fields) -> ModelConfig:
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  common = read_common(f)
  head_dim = f.get("head_dim")
  if head_dim is not None and int(head_dim) * common["n_heads"] == common["d_model"]:
    head_dim = None  # the default head dim, spelled as s3r's presets spell it
  return ModelConfig(
    **common, d_head=None if head_dim is None else int(head_dim), rope_theta=theta, rope_scaling=scaling
  )


def write(cfg: ModelConfig) -> dict:
  return {**write_common(cfg, "LlamaForCausalLM", "llama"), "hidden_act": "silu", "mlp_bias": False}


def block_tensors(cfg: ModelConfig, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  return layouts.attention(b, p) + layouts.pre_norms(b, p) + layouts.gated(b, f"{p}.mlp")


TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=128)

PRESETS = {
  "tiny": ModelConfig(**TINY),
  "cpu-small": ModelConfig(
    vocab_size=8192, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512, max_seq_len=256
  ),
  "paper-12l": ModelConfig(
    vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048, max_seq_len=2048
  ),
  "llama3.1-8b": ModelConfig(
    vocab_size=128256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    d_ff=14336,
    max_seq_len=131072,
    rope_theta=500_000.0,
    rope_scaling=RopeScaling(
      kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192
    ),
    norm_eps=1e-5,
  ),
  "llama-tiny": ModelConfig(
    **TINY, rope_theta=500_000.0, rope_scaling=RopeScaling(kind="llama3", factor=8.0, original_max_seq_len=32)
  ),
}

FAMILY = Family(
  config=ModelConfig,
  block=Block,
  readers={"LlamaForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  presets=PRESETS,
  sibling="llama-tiny",
)
