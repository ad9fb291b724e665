"""DeepSeek-V2: multi-head latent attention (MLA; RoPE dims stored interleaved), leading dense
layers, then routed and shared experts (`DeepseekV2ForCausalLM`)."""

from __future__ import annotations

from s3r.model.config import DeepSeekV2Config
from s3r.model.families.base import Family
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, refuse_export, rope, rope_parameters, write_common
from s3r.model.mla import DeepSeekV2Block


def read(f: Fields) -> DeepSeekV2Config:
  f.expect("topk_method", {"greedy"}, "greedy", "s3r routes to the top-k experts of all (greedy)")
  f.expect("scoring_func", {"softmax"}, "softmax", "s3r's router is a softmax")
  f.expect("moe_layer_freq", {1}, 1, "s3r's MoE layers follow the dense ones without gaps")
  f.expect(
    "norm_topk_prob", {False}, False, "DeepSeek's own code and transformers disagree on it (transformers ignores it)"
  )
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0, mla=True)
  common = read_common(f)
  if common["n_kv_heads"] != common["n_heads"]:
    f.refuse("num_key_value_heads", common["n_kv_heads"], "MLA has one key/value head per query head")
  n_layers, rope_dim = common["n_layers"], int(f.get("qk_rope_head_dim", 64))
  per_head = common["d_model"] // common["n_heads"]
  q_lora = f.given("q_lora_rank", 1536)  # absent: transformers' default; null: no query compression
  return DeepSeekV2Config(
    **common,
    d_head=None if common["d_model"] % common["n_heads"] == 0 and per_head % 2 == 0 else rope_dim,
    rope_theta=theta,
    rope_scaling=scaling,
    n_experts=int(f.get("n_routed_experts", 64)),
    top_k=int(f.need("num_experts_per_tok")),
    d_expert=int(f.get("moe_intermediate_size", 1407)),
    n_shared=int(f.given("n_shared_experts", 2) or 0),  # absent: transformers' default; null: none
    dense_layers=min(int(f.get("first_k_dense_replace", 0)), n_layers),
    renormalize=False,
    routed_scaling_factor=float(f.get("routed_scaling_factor", 1.0)),
    aux_loss_weight=float(f.get("aux_loss_alpha", 0.001)),
    q_lora_rank=None if q_lora is None else int(q_lora),
    kv_lora_rank=int(f.get("kv_lora_rank", 512)),
    qk_nope_head_dim=int(f.get("qk_nope_head_dim", 128)),
    qk_rope_head_dim=rope_dim,
    v_head_dim=int(f.get("v_head_dim", 128)),
  )


def write(cfg: DeepSeekV2Config) -> dict:
  if cfg.renormalize:
    raise refuse_export(cfg, "renormalize", "transformers' DeepSeek-V2 does not renormalize the top-k weights")
  out = write_common(cfg, "DeepseekV2ForCausalLM", "deepseek_v2")
  return {
    **out,
    "num_key_value_heads": cfg.n_heads,
    "head_dim": cfg.qk_rope_head_dim,
    "hidden_act": "silu",
    "mlp_bias": False,
    "n_routed_experts": cfg.n_experts,
    "num_experts_per_tok": cfg.top_k,
    "moe_intermediate_size": cfg.d_expert,
    "n_shared_experts": cfg.n_shared,
    "first_k_dense_replace": cfg.dense_layers,
    "routed_scaling_factor": cfg.routed_scaling_factor,
    "aux_loss_alpha": cfg.aux_loss_weight,
    "topk_method": "greedy",
    "norm_topk_prob": False,
    "q_lora_rank": cfg.q_lora_rank,
    "kv_lora_rank": cfg.kv_lora_rank,
    "qk_nope_head_dim": cfg.qk_nope_head_dim,
    "qk_rope_head_dim": cfg.qk_rope_head_dim,
    "v_head_dim": cfg.v_head_dim,
  }


def _mla_tensors(cfg: DeepSeekV2Config, b: layouts.Path, p: str) -> list[layouts.Entry]:
  a, r = f"{p}.self_attn", cfg.qk_rope_head_dim
  q = layouts.RopeLinear(group=cfg.qk_nope_head_dim + r, r=r)
  if cfg.q_lora_rank is None:
    out = [layouts.linear((*b, "q"), f"{a}.q_proj", q)]
  else:
    out = [
      layouts.linear((*b, "q_a"), f"{a}.q_a_proj"),
      layouts.norm((*b, "q_a_norm"), f"{a}.q_a_layernorm"),
      layouts.linear((*b, "q_b"), f"{a}.q_b_proj", q),
    ]
  return out + [
    layouts.linear((*b, "kv_a"), f"{a}.kv_a_proj_with_mqa", layouts.RopeLinear(group=cfg.kv_lora_rank + r, r=r)),
    layouts.norm((*b, "kv_a_norm"), f"{a}.kv_a_layernorm"),
    layouts.linear((*b, "kv_b"), f"{a}.kv_b_proj"),
    layouts.linear((*b, "o"), f"{a}.o_proj"),
  ]


def block_tensors(cfg: DeepSeekV2Config, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  ffn = layouts.moe(cfg, b, p, fused) if cfg.is_moe(layer) else layouts.gated(b, f"{p}.mlp")
  return _mla_tensors(cfg, b, p) + layouts.pre_norms(b, p) + ffn


FAMILY = Family(
  config=DeepSeekV2Config,
  block=DeepSeekV2Block,
  readers={"DeepseekV2ForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  inference={"capacity_factor": None},  # dropless routing: a capacity would depend on a step's token count
)
