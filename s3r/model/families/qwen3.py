"""Qwen3 dense: the Llama block with per-head RMSNorm of queries and keys (`Qwen3ForCausalLM`)."""

from __future__ import annotations

from s3r.model.blocks import Qwen3Block
from s3r.model.config import Qwen3Config
from s3r.model.families.base import Family
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, rope, rope_parameters, write_common


def full_attention_only(f: Fields) -> None:
  """Refuses a sliding window (Qwen3 and Qwen3-MoE configs can ask for one; s3r's layers attend globally)."""
  f.expect("use_sliding_window", {False}, False, "s3r's Qwen3 layers attend over the full context")
  types = f.get("layer_types")
  if types is not None and set(types) - {"full_attention"}:
    f.refuse("layer_types", types, "s3r's Qwen3 layers attend over the full context")


def read(f: Fields) -> Qwen3Config:
  full_attention_only(f)
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  return Qwen3Config(**read_common(f), d_head=int(f.get("head_dim", 128)), rope_theta=theta, rope_scaling=scaling)


def write(cfg: Qwen3Config) -> dict:
  return {**write_common(cfg, "Qwen3ForCausalLM", "qwen3"), "hidden_act": "silu", "use_sliding_window": False}


def block_tensors(cfg: Qwen3Config, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  return layouts.attention(b, p, qk_norm=True) + layouts.pre_norms(b, p) + layouts.gated(b, f"{p}.mlp")


FAMILY = Family(
  config=Qwen3Config, block=Qwen3Block, readers={"Qwen3ForCausalLM": read}, writer=write, block_tensors=block_tensors
)
