"""Qwen3-MoE: Qwen3 attention with routed experts, optionally after leading dense layers
(`Qwen3MoeForCausalLM`). The block is the Qwen3 block whose feed-forward is the routed MoE
`s3r.model.moe.MoEFeedForward` (a dense gated FFN in the first `dense_layers` layers).

| preset             | layers | width | params          | active         |
|--------------------|--------|-------|-----------------|----------------|
| `qwen3-30b-a3b`    | 48     | 2048  | 30,532,122,624  | 3,353,032,704  |
| `qwen3-moe-tiny`   | 2      | 64    | 288,128         | 140,672        |
| `moe-tiny`         | 2      | 64    | 152,448         | 127,872        |
| `moe-cpu-small`    | 4      | 192   | 6,864,832       | 4,652,992      |

`qwen3-30b-a3b` has the published dimensions (docs/models.md); `qwen3-moe-tiny` is its structure at
width 64. `moe-tiny` (tests) and `moe-cpu-small` (CPU experiments) are the MoE training presets:
Qwen3-MoE blocks with top-2 of 8 (tiny: 4) routed experts and one shared expert; `moe-cpu-small` has
`cpu-small`'s attention, embeddings and depth, and its active expert width (3 x 160) is close to
`cpu-small`'s d_ff = 512, so that a step costs about the same (docs/moe.md).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from s3r.model.blocks import moe_call, moe_feed_forward
from s3r.model.config import MoeFields
from s3r.model.families.base import Family
from s3r.model.families.llama import TINY
from s3r.model.families.qwen3 import Qwen3Block, Qwen3Config, full_attention_only
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, dense_prefix, read_common, refuse_export, rope, rope_parameters, write_common
from s3r.model.layers import Block


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3MoeConfig(MoeFields, Qwen3Config):
  """Qwen3-MoE: Qwen3 attention, every layer a routed MoE (renormalized top-k; the published model has
  no shared expert, the moe-* training presets have one)."""

  family: ClassVar[str] = "qwen3_moe"

  def __post_init__(self):
    super().__post_init__()
    self._check_moe()


MOE_KEY = len(Block.PROJECTIONS)  # fold-in index of the MoE feed-forward's key (after the attention projections)


class Qwen3MoeBlock(Qwen3Block[Qwen3MoeConfig]):
  """Qwen3 attention with a routed mixture-of-experts feed-forward (dense gated FFN in the first
  `dense_layers` layers)."""

  def _init_ffn(self, k: dict, std: float, out_std: float):
    if self.cfg.is_moe(self.layer):
      self.moe = moe_feed_forward(self.cfg, k["gate"])
    else:
      super()._init_ffn(k, std, out_std)

  def _ffn(self, h_BxSxD, layer_key):
    if not self.cfg.is_moe(self.layer):
      return super()._ffn(h_BxSxD, layer_key)
    return moe_call(self.moe, h_BxSxD, layer_key, MOE_KEY)


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


PRESETS = {
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
  "qwen3-moe-tiny": Qwen3MoeConfig(**{**TINY, "d_head": 16}, rope_theta=1_000_000.0, n_experts=8, top_k=2, d_expert=64),
  # MoE training presets: Qwen3-MoE blocks with one shared expert; moe-cpu-small costs about what
  # cpu-small costs per step (top-2 + shared = 3 x 160 active expert units against d_ff = 512).
  "moe-tiny": Qwen3MoeConfig(**{**TINY, "d_head": 16}, n_experts=4, top_k=2, d_expert=32, n_shared=1),
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

FAMILY = Family(
  config=Qwen3MoeConfig,
  block=Qwen3MoeBlock,
  readers={"Qwen3MoeForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  presets=PRESETS,
  sibling="qwen3-moe-tiny",
  inference={"capacity_factor": None},  # dropless routing: a capacity would depend on a step's token count
)
