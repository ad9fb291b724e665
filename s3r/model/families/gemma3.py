"""Gemma 3: QK-norm, norms before and after each sublayer with (1 + scale), GeGLU (tanh GELU),
5 local : 1 global attention layers, the embedding scaled by sqrt(D) (`Gemma3ForCausalLM`, and the
text tower of `Gemma3ForConditionalGeneration`)."""

from __future__ import annotations

from s3r.model.blocks import Gemma3Block
from s3r.model.config import Gemma3Config
from s3r.model.families.base import Family
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, rope, rope_parameters, write_common


def global_every(f: Fields, n_layers: int) -> int:
  """The period of Gemma 3's local/global pattern: layer l is global iff (l + 1) % period == 0."""
  types = f.get("layer_types")
  if types is None:
    return int(f.get("sliding_window_pattern", f.get("_sliding_window_pattern", 6)))
  is_global = [t == "full_attention" for t in types]
  if len(types) != n_layers or set(types) - {"full_attention", "sliding_attention"}:
    f.refuse("layer_types", types, f"expected {n_layers} of full_attention / sliding_attention")
  period = is_global.index(True) + 1 if any(is_global) else n_layers + 1
  if is_global != [(layer + 1) % period == 0 for layer in range(n_layers)]:
    f.refuse("layer_types", types, "s3r makes every k-th layer global and the others sliding-window")
  return period


def read(f: Fields) -> Gemma3Config:
  f.expect("hidden_act", {"gelu_pytorch_tanh"}, "gelu_pytorch_tanh", "Gemma 3's GeGLU uses the tanh GELU")
  for field in ("final_logit_softcapping", "attn_logit_softcapping"):
    f.expect(field, {None}, None, "s3r applies no soft-capping")
  f.expect("use_bidirectional_attention", {False}, False, "s3r's attention is causal")
  params = f.get("rope_parameters")
  if params is not None and "full_attention" in params:
    glob, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
  else:  # older spelling: rope_theta, rope_scaling (global layers) and rope_local_base_freq
    glob, local = rope_parameters(f), {"rope_theta": f.get("rope_local_base_freq", 10_000.0)}
  theta, scaling = rope(glob, f, "rope_parameters.full_attention", 1_000_000.0)
  local_theta, local_scaling = rope(local, f, "rope_parameters.sliding_attention", 10_000.0)
  if local_scaling is not None:
    f.refuse("rope_parameters.sliding_attention.rope_type", local_scaling.kind, "s3r's local layers use plain RoPE")
  common = read_common(f, act_field="hidden_activation", act="gelu_pytorch_tanh")
  common["tie_embeddings"] = bool(f.get("tie_word_embeddings", True))
  return Gemma3Config(
    **common,
    d_head=int(f.get("head_dim", 256)),
    rope_theta=theta,
    rope_scaling=scaling,
    sliding_window=int(f.get("sliding_window", 4096)),
    global_every=global_every(f, common["n_layers"]),
    local_rope_theta=local_theta,
    query_pre_attn_scalar=float(f.get("query_pre_attn_scalar", 256)),
  )


def read_multimodal(f: Fields) -> Gemma3Config:
  """The text tower of Gemma3ForConditionalGeneration (the vision tower and projector are not imported)."""
  return read(f.sub("text_config"))


def write(cfg: Gemma3Config) -> dict:
  out = write_common(cfg, "Gemma3ForCausalLM", "gemma3_text")
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


def block_tensors(cfg: Gemma3Config, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  norms = [
    layouts.norm((*b, "attn_norm"), f"{p}.input_layernorm"),
    layouts.norm((*b, "post_attn_norm"), f"{p}.post_attention_layernorm"),
    layouts.norm((*b, "mlp_norm"), f"{p}.pre_feedforward_layernorm"),
    layouts.norm((*b, "post_mlp_norm"), f"{p}.post_feedforward_layernorm"),
  ]
  return layouts.attention(b, p, qk_norm=True) + norms + layouts.gated(b, f"{p}.mlp")


FAMILY = Family(
  config=Gemma3Config,
  block=Gemma3Block,
  readers={"Gemma3ForCausalLM": read, "Gemma3ForConditionalGeneration": read_multimodal},
  writer=write,
  block_tensors=block_tensors,
)
