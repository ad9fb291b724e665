"""`config.json` of a Hugging Face checkpoint -> the s3r model config of its family.

Every field of each architecture's `transformers` config class is either honoured exactly, irrelevant
to the computed function (token ids, cache and initialization settings, the storage dtype), or refused
with an HFConfigError naming the field and its value when it asks for something s3r does not compute
(docs/models.md lists the fields). Keys the config class does not have are ignored, as `transformers`
ignores them, except the DeepSeek remote-code keys that change that code's function (moe_layer_freq,
scoring_func). Both the current `rope_parameters` and the older `rope_theta` + `rope_scaling` spellings
are read.
"""

from __future__ import annotations

from typing import Any

from s3r.model.config import DeepSeekV2Config, Gemma3Config, ModelConfig, Qwen3Config, Qwen3MoeConfig, RopeScaling
from s3r.model.hf.errors import HFConfigError

_ROPE_KEYS = {  # the keys each rope type may have (rope_type / type and rope_theta always)
  "default": set(),
  "linear": {"factor"},
  "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
  "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"},
}
_YARN_DEFAULTS = {"attention_factor": None, "truncate": True, "partial_rotary_factor": 1.0}  # refused otherwise


class Fields:
  """Reads one config dict; every refusal names the file, the field and its value."""

  def __init__(self, hf: dict, source: str, prefix: str = ""):
    self.hf, self.source, self.prefix = hf, source, prefix

  def refuse(self, field: str, value, why: str):
    raise HFConfigError(f"{self.source}: {self.prefix}{field}={value!r} is not supported: {why}")

  def get(self, field: str, default: Any = None) -> Any:
    value = self.hf.get(field)
    return default if value is None else value

  def given(self, field: str, default: Any) -> Any:
    """The field's value, null included (a null that means "none", unlike an absent field's `default`)."""
    return self.hf[field] if field in self.hf else default

  def need(self, field: str) -> Any:
    if self.hf.get(field) is None:
      raise HFConfigError(f"{self.source}: {self.prefix}{field} is missing")
    return self.hf[field]

  def expect(self, field: str, allowed, default, why: str):
    """The field's value (default when absent); refused unless it is one of `allowed`."""
    value = self.get(field, default)
    if value not in allowed:
      self.refuse(field, value, why)
    return value

  def sub(self, field: str) -> Fields:
    value = self.need(field)
    if not isinstance(value, dict):
      self.refuse(field, value, "expected an object")
    return Fields(value, self.source, f"{self.prefix}{field}.")


def rope(rope: dict, f: Fields, where: str, default_theta: float, *, mla: bool = False):
  """(rope_theta, RopeScaling or None) of one RoPE parameter dict (`where` names it in errors)."""
  rf = Fields(rope, f.source, f"{f.prefix}{where}.")
  kind = rope.get("rope_type", rope.get("type")) or "default"
  if kind not in _ROPE_KEYS:
    rf.refuse("rope_type", kind, f"s3r implements {', '.join(_ROPE_KEYS)}")
  for key, value in rope.items():
    if key in ("rope_type", "type", "rope_theta") or key in _ROPE_KEYS[kind] or value is None:
      continue
    if _YARN_DEFAULTS.get(key, object()) != value:
      rf.refuse(key, value, f"not part of s3r's {kind} RoPE")
  theta = float(rf.get("rope_theta", default_theta))
  if kind == "default":
    return theta, None
  factor = float(rf.need("factor"))
  if kind == "linear":
    return theta, RopeScaling(kind="linear", factor=factor)
  original = int(rf.need("original_max_position_embeddings"))
  if kind == "llama3":
    low, high = float(rf.need("low_freq_factor")), float(rf.need("high_freq_factor"))
    return theta, RopeScaling(
      kind="llama3", factor=factor, original_max_seq_len=original, low_freq_factor=low, high_freq_factor=high
    )
  return theta, _yarn(rf, factor, original, mla)


def _yarn(rf: Fields, factor: float, original: int, mla: bool) -> RopeScaling:
  # transformers: cos/sin x m(mscale) / m(mscale_all_dim) when both are set, else x m(1); MLA's softmax
  # scale x m(mscale_all_dim)^2 when mscale_all_dim is set. s3r: m(mscale) / m(mscale_all_dim) and the same
  # softmax term, so mscale_all_dim unset means mscale = 1 (the reference ignores mscale then).
  mscale, all_dim = float(rf.get("mscale", 0.0)), float(rf.get("mscale_all_dim", 0.0))
  if not (mscale and all_dim):
    if mla and all_dim:
      rf.refuse("mscale", rf.get("mscale"), "MLA with mscale_all_dim but no mscale scales cos/sin by m(1)")
    mscale, all_dim = 1.0, 0.0
  beta_fast, beta_slow = float(rf.get("beta_fast", 32.0) or 32.0), float(rf.get("beta_slow", 1.0) or 1.0)
  return RopeScaling(
    kind="yarn",
    factor=factor,
    original_max_seq_len=original,
    beta_fast=beta_fast,
    beta_slow=beta_slow,
    mscale=mscale,
    mscale_all_dim=all_dim,
  )


def rope_parameters(f: Fields) -> dict:
  """The RoPE dict in the current spelling (`rope_parameters`), built from rope_theta + rope_scaling if absent."""
  params = f.get("rope_parameters")
  if params is not None:
    return dict(params)
  legacy = dict(f.get("rope_scaling", {}))
  if f.get("rope_theta") is not None:
    legacy["rope_theta"] = f.get("rope_theta")
  return legacy


def _common(f: Fields, *, act_field: str = "hidden_act", act: str = "silu") -> dict:
  """The fields every family shares, and the refusals they share."""
  f.expect(act_field, {act}, act, f"the family's feed-forward uses {act}")
  f.expect("attention_bias", {False}, False, "s3r's projections have no bias")
  f.expect("mlp_bias", {False}, False, "s3r's projections have no bias")
  f.expect("attention_dropout", {0}, 0.0, "s3r has no dropout")
  heads = int(f.need("num_attention_heads"))
  return dict(
    vocab_size=int(f.need("vocab_size")),
    d_model=int(f.need("hidden_size")),
    n_layers=int(f.need("num_hidden_layers")),
    n_heads=heads,
    n_kv_heads=int(f.get("num_key_value_heads", heads)),
    d_ff=int(f.need("intermediate_size")),
    max_seq_len=int(f.need("max_position_embeddings")),
    norm_eps=float(f.get("rms_norm_eps", 1e-6)),
    tie_embeddings=bool(f.get("tie_word_embeddings", False)),
  )


def _full_attention_only(f: Fields) -> None:
  f.expect("use_sliding_window", {False}, False, "s3r's Qwen3 layers attend over the full context")
  types = f.get("layer_types")
  if types is not None and set(types) - {"full_attention"}:
    f.refuse("layer_types", types, "s3r's Qwen3 layers attend over the full context")


def llama(f: Fields) -> ModelConfig:
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  common = _common(f)
  head_dim = f.get("head_dim")
  if head_dim is not None and int(head_dim) * common["n_heads"] == common["d_model"]:
    head_dim = None  # the default head dim, spelled as s3r's presets spell it
  return ModelConfig(
    **common, d_head=None if head_dim is None else int(head_dim), rope_theta=theta, rope_scaling=scaling
  )


def qwen3(f: Fields) -> Qwen3Config:
  _full_attention_only(f)
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  return Qwen3Config(**_common(f), d_head=int(f.get("head_dim", 128)), rope_theta=theta, rope_scaling=scaling)


def _global_every(f: Fields, n_layers: int) -> int:
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


def gemma3(f: Fields) -> Gemma3Config:
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
  common = _common(f, act_field="hidden_activation", act="gelu_pytorch_tanh")
  common["tie_embeddings"] = bool(f.get("tie_word_embeddings", True))
  return Gemma3Config(
    **common,
    d_head=int(f.get("head_dim", 256)),
    rope_theta=theta,
    rope_scaling=scaling,
    sliding_window=int(f.get("sliding_window", 4096)),
    global_every=_global_every(f, common["n_layers"]),
    local_rope_theta=local_theta,
    query_pre_attn_scalar=float(f.get("query_pre_attn_scalar", 256)),
  )


def gemma3_multimodal(f: Fields) -> Gemma3Config:
  """The text tower of Gemma3ForConditionalGeneration (the vision tower and projector are not imported)."""
  return gemma3(f.sub("text_config"))


def _dense_prefix(f: Fields, dense: list[int], fields: str) -> int:
  """The number of leading dense layers; refused unless the dense layers are exactly a prefix."""
  if dense != list(range(len(dense))):
    f.refuse(fields, f"dense layers {dense}", "s3r's MoE families have dense layers only before the MoE layers")
  return len(dense)


def qwen3_moe(f: Fields) -> Qwen3MoeConfig:
  _full_attention_only(f)
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0)
  common = _common(f)
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
    dense_layers=_dense_prefix(f, dense, fields),
    renormalize=bool(f.get("norm_topk_prob", False)),
    aux_loss_weight=float(f.get("router_aux_loss_coef", 0.001)),
  )


def deepseek_v2(f: Fields) -> DeepSeekV2Config:
  f.expect("topk_method", {"greedy"}, "greedy", "s3r routes to the top-k experts of all (greedy)")
  f.expect("scoring_func", {"softmax"}, "softmax", "s3r's router is a softmax")
  f.expect("moe_layer_freq", {1}, 1, "s3r's MoE layers follow the dense ones without gaps")
  f.expect(
    "norm_topk_prob", {False}, False, "DeepSeek's own code and transformers disagree on it (transformers ignores it)"
  )
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0, mla=True)
  common = _common(f)
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


ARCHITECTURES = {
  "LlamaForCausalLM": llama,
  "Qwen3ForCausalLM": qwen3,
  "Gemma3ForCausalLM": gemma3,
  "Gemma3ForConditionalGeneration": gemma3_multimodal,
  "Qwen3MoeForCausalLM": qwen3_moe,
  "DeepseekV2ForCausalLM": deepseek_v2,
}


def architecture(hf: dict, source: str) -> str:
  """The one architecture of `config.json` that s3r imports; HFConfigError otherwise."""
  names = hf.get("architectures")
  if not isinstance(names, list) or len(names) != 1:
    raise HFConfigError(f"{source}: architectures={names!r}: expected one of {', '.join(ARCHITECTURES)}")
  if names[0] not in ARCHITECTURES:
    raise HFConfigError(f"{source}: architectures={names!r}: s3r imports {', '.join(ARCHITECTURES)}")
  return names[0]


def model_config(hf: dict, source: str) -> ModelConfig:
  """The s3r config of the checkpoint's `config.json` (already parsed; `source` names it in errors)."""
  f = Fields(hf, source)
  try:
    return ARCHITECTURES[architecture(hf, source)](f)
  except HFConfigError:
    raise
  except (TypeError, ValueError) as e:  # a field of the wrong type, or an s3r config check
    raise HFConfigError(f"{source}: {e}") from None
