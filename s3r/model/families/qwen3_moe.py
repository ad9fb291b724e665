"""Qwen3-MoE: Qwen3 attention with routed experts, optionally after leading dense layers
(`Qwen3MoeForCausalLM`)."""

from __future__ import annotations

from s3r.model.blocks import Qwen3MoeBlock
from s3r.model.config import Qwen3MoeConfig
from s3r.model.families.base import Family
from s3r.model.families.qwen3 import full_attention_only
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, dense_prefix, read_common, refuse_export, rope, rope_parameters, write_common


def read(f: Fields) -> Qwen3MoeConfig:
  full_attention_only(f)
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  common = read_common(f)
  n_experts = int(f.get("num_experts", f.get("num_local_experts", 128)))
  step, only = int(f.get("decoder_sparse_step", 1)), [int(i) for i in f.get("mlp_only_layers", [])]
  dense = [
    layer for layer in range(common["n_layers"]) if layer in only or not (n_experts > 0 and (layer + 1) % step == 0)
  ]
  fields = f"mlp_only_layers={only}, decoder_sparse_step"
  return Qwen3MoeConfig(
    **common,
    d_head=int(f.get("head_dim", common["d_model"] // common["n_heads"])),  # transformers' default
    rope_theta=theta,
    rope_scaling=scaling,
    n_experts=max(n_experts, 1),
    top_k=int(f.get("num_experts_per_tok", 8)),
    d_expert=int(f.get("moe_intermediate_size", 768)),
    dense_layers=dense_prefix(f, dense, fields),
    renormalize=bool(f.get("norm_topk_prob", False)),
    aux_loss_weight=float(f.get("router_aux_loss_coef", 0.001)),
  )


def write(cfg: Qwen3MoeConfig) -> dict:
  if cfg.n_shared:
    raise refuse_export(cfg, "n_shared", "transformers' Qwen3-MoE has no shared experts")
  if cfg.routed_scaling_factor != 1.0:
    raise refuse_export(cfg, "routed_scaling_factor", "transformers' Qwen3-MoE does not scale the routed experts")
  return {
    **write_common(cfg, "Qwen3MoeForCausalLM", "qwen3_moe"),
    "hidden_act": "silu",
    "use_sliding_window": False,
    "num_local_experts": cfg.n_experts,
    "num_experts_per_tok": cfg.top_k,
    "moe_intermediate_size": cfg.d_expert,
    "decoder_sparse_step": 1,
    "mlp_only_layers": list(range(cfg.dense_layers)),
    "norm_topk_prob": cfg.renormalize,
    "router_aux_loss_coef": cfg.aux_loss_weight,
  }


def block_tensors(cfg: Qwen3MoeConfig, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  ffn = layouts.moe(cfg, b, p, fused) if cfg.is_moe(layer) else layouts.gated(b, f"{p}.mlp")
  return layouts.attention(b, p, qk_norm=True) + layouts.pre_norms(b, p) + ffn


FAMILY = Family(
  config=Qwen3MoeConfig,
  block=Qwen3MoeBlock,
  readers={"Qwen3MoeForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  inference={"capacity_factor": None},  # dropless routing: a capacity would depend on a step's token count
)
