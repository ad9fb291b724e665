"""Llama 3: GQA with RoPE (Llama 3 band-wise, linear or YaRN scaling), SwiGLU (`LlamaForCausalLM`)."""

from __future__ import annotations

from s3r.model.config import ModelConfig
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


FAMILY = Family(
  config=ModelConfig, block=Block, readers={"LlamaForCausalLM": read}, writer=write, block_tensors=block_tensors
)
