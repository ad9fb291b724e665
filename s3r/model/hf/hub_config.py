"""An s3r model config -> the `config.json` of its family's `transformers` class (the inverse of
s3r.model.hf.configs: `hf_config` of the written file gives the config back).

The file is written in the form current `transformers` (5.x) writes: RoPE as `rope_parameters` (one
dict with `rope_type` and `rope_theta`, per layer type for Gemma 3), Qwen3-MoE's expert count as
`num_local_experts`. `carried_config` writes the config of a checkpoint imported from a folder: that
folder's `config.json` with every field carried through unchanged but those that training changed
(e.g. the layer count of `--init-layers`), in that form. Fields of s3r's training (recipe, remat,
sharding, MoE capacity and dispatch, init_std) have no place in the file; an s3r config that a
`transformers` model cannot compute (e.g. a Qwen3-MoE with shared experts) is refused with a
ValueError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from s3r.model.config import DeepSeekV2Config, Gemma3Config, ModelConfig, Qwen3Config, Qwen3MoeConfig

TORCH_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}  # numpy dtype name -> config.json "dtype"


def _refuse(cfg: ModelConfig, field: str, why: str) -> ValueError:
  return ValueError(f"{type(cfg).__name__}.{field}={getattr(cfg, field)!r} cannot be exported: {why}")


def _rope_parameters(cfg: ModelConfig) -> dict:
  """`rope_parameters` of the global layers: the rope type, rope_theta and the scaling's fields."""
  return {"rope_type": "default", **(_rope_scaling(cfg) or {}), "rope_theta": cfg.rope_theta}


def _rope_scaling(cfg: ModelConfig) -> dict | None:
  s = cfg.rope_scaling
  if s is None:
    return None
  if s.kind == "linear":
    return {"rope_type": "linear", "factor": s.factor}
  if s.kind == "llama3":
    return {
      "rope_type": "llama3",
      "factor": s.factor,
      "low_freq_factor": s.low_freq_factor,
      "high_freq_factor": s.high_freq_factor,
      "original_max_position_embeddings": s.original_max_seq_len,
    }
  out = {
    "rope_type": "yarn",
    "factor": s.factor,
    "original_max_position_embeddings": s.original_max_seq_len,
    "beta_fast": s.beta_fast,
    "beta_slow": s.beta_slow,
  }
  if s.mscale_all_dim:  # transformers applies mscale / mscale_all_dim only when both are set
    return {**out, "mscale": s.mscale, "mscale_all_dim": s.mscale_all_dim}
  if s.mscale != 1.0:
    raise _refuse(cfg, "rope_scaling", "yarn's mscale without mscale_all_dim is fixed at 1 in transformers")
  return out


def _common(cfg: ModelConfig, architecture: str, model_type: str) -> dict:
  return {
    "architectures": [architecture],
    "model_type": model_type,
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "num_hidden_layers": cfg.n_layers,
    "num_attention_heads": cfg.n_heads,
    "num_key_value_heads": cfg.n_kv_heads,
    "head_dim": cfg.head_dim,
    "intermediate_size": cfg.d_ff,
    "max_position_embeddings": cfg.max_seq_len,
    "rms_norm_eps": cfg.norm_eps,
    "tie_word_embeddings": cfg.tie_embeddings,
    "rope_parameters": _rope_parameters(cfg),
    "attention_bias": False,
    "attention_dropout": 0.0,
  }


def _llama(cfg: ModelConfig) -> dict:
  return {**_common(cfg, "LlamaForCausalLM", "llama"), "hidden_act": "silu", "mlp_bias": False}


def _qwen3(cfg: Qwen3Config) -> dict:
  return {**_common(cfg, "Qwen3ForCausalLM", "qwen3"), "hidden_act": "silu", "use_sliding_window": False}


def _gemma3(cfg: Gemma3Config) -> dict:
  out = _common(cfg, "Gemma3ForCausalLM", "gemma3_text")
  return {
    **out,
    "rope_parameters": {
      "full_attention": out["rope_parameters"],
      "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
    },
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": cfg.sliding_window,
    "layer_types": ["full_attention" if cfg.is_global(layer) else "sliding_attention" for layer in range(cfg.n_layers)],
    "query_pre_attn_scalar": int(q) if (q := cfg.query_pre_attn_scalar) == int(q) else q,  # an int in transformers 5
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
  }


def _qwen3_moe(cfg: Qwen3MoeConfig) -> dict:
  if cfg.n_shared:
    raise _refuse(cfg, "n_shared", "transformers' Qwen3-MoE has no shared experts")
  if cfg.routed_scaling_factor != 1.0:
    raise _refuse(cfg, "routed_scaling_factor", "transformers' Qwen3-MoE does not scale the routed experts")
  return {
    **_common(cfg, "Qwen3MoeForCausalLM", "qwen3_moe"),
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


def _deepseek_v2(cfg: DeepSeekV2Config) -> dict:
  if cfg.renormalize:
    raise _refuse(cfg, "renormalize", "transformers' DeepSeek-V2 does not renormalize the top-k weights")
  out = _common(cfg, "DeepseekV2ForCausalLM", "deepseek_v2")
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


_WRITERS: dict[type, Callable[[Any], dict]] = {  # exact classes: a subclass of another family's config is that family
  ModelConfig: _llama,
  Qwen3Config: _qwen3,
  Gemma3Config: _gemma3,
  Qwen3MoeConfig: _qwen3_moe,
  DeepSeekV2Config: _deepseek_v2,
}


def hub_config(cfg: ModelConfig, *, dtype: str, bos_id: int | None = None, eos_id: int | None = None) -> dict:
  """The `config.json` dict of `cfg` for weights stored in `dtype` ("bfloat16" or "float32")."""
  writer = _WRITERS.get(type(cfg))
  if writer is None:
    raise ValueError(f"{type(cfg).__name__} is not a family s3r exports ({', '.join(c.__name__ for c in _WRITERS)})")
  out = writer(cfg)
  return {**out, "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": TORCH_DTYPES[dtype], "torch_dtype": dtype}


# older spellings of fields `hub_config` writes in the current form (the current key: the older ones)
_LEGACY_KEYS = {
  "rope_parameters": ("rope_theta", "rope_scaling", "rope_local_base_freq"),
  "num_local_experts": ("num_experts",),
}


def carried_config(source: dict, imported: ModelConfig, cfg: ModelConfig, *, dtype: str) -> dict:
  """The `config.json` dict of `cfg`, a model imported as `imported` from a folder whose `config.json` is
  `source`: every field of `source` unchanged, but those whose value `cfg` changed (as `hub_config` writes
  them: the layer count and what follows from it, the context length, ...), the older spellings of
  `_LEGACY_KEYS` in the current form, a `layer_types` list cut to the layer count, and the stored dtype."""
  before, after = hub_config(imported, dtype=dtype), hub_config(cfg, dtype=dtype)
  if isinstance(source.get("text_config"), dict):  # a multimodal checkpoint: its text model is the causal LM
    top = {k: source[k] for k in ("transformers_version",) if k in source}
    source = {**top, **source["text_config"], "architectures": before["architectures"]}
  out = dict(source)
  for current, legacy in _LEGACY_KEYS.items():
    if current in after and any(key in out for key in legacy):
      out = {k: v for k, v in out.items() if k not in legacy}
      out.setdefault(current, after[current])
  skip = {"bos_token_id", "eos_token_id", "dtype", "torch_dtype"}
  out.update({k: v for k, v in after.items() if k not in skip and v != before.get(k)})
  if isinstance(out.get("layer_types"), list):
    out["layer_types"] = out["layer_types"][: cfg.n_layers]
  out["dtype"] = TORCH_DTYPES[dtype]
  if "torch_dtype" in source:
    out["torch_dtype"] = dtype
  return out
