"""Reading and writing the fields of a Hugging Face `config.json` that the families share.

Reading (`Fields`, `rope`, `read_common`, ...): every field of an architecture's `transformers` config
class is either honoured exactly, irrelevant to the computed function (token ids, cache and
initialization settings, the storage dtype), or refused with an HFConfigError naming the field and
its value when it asks for something s3r does not compute (docs/models.md lists the fields). Keys the
config class does not have are ignored, as `transformers` ignores them. Both the current
`rope_parameters` and the older `rope_theta` + `rope_scaling` spellings are read.

Writing (`write_common`, `write_rope_parameters`, `refuse_export`): the form current `transformers`
(5.x) writes, RoPE as `rope_parameters` (one dict with `rope_type` and `rope_theta`). Each family's
own fields are read and written in its module (s3r.model.families).
"""

from __future__ import annotations

from typing import Any

from s3r.model.config import ModelConfig, RopeScaling
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


def read_common(f: Fields, *, act_field: str = "hidden_act", act: str = "silu") -> dict:
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


def dense_prefix(f: Fields, dense: list[int], fields: str) -> int:
  """The number of leading dense layers; refused unless the dense layers are exactly a prefix."""
  if dense != list(range(len(dense))):
    f.refuse(fields, f"dense layers {dense}", "s3r's MoE families have dense layers only before the MoE layers")
  return len(dense)


# Writing


def refuse_export(cfg: ModelConfig, field: str, why: str) -> ValueError:
  return ValueError(f"{type(cfg).__name__}.{field}={getattr(cfg, field)!r} cannot be exported: {why}")


def write_rope_parameters(cfg: ModelConfig) -> dict:
  """`rope_parameters` of the global layers: the rope type, rope_theta and the scaling's fields."""
  return {"rope_type": "default", **(_write_rope_scaling(cfg) or {}), "rope_theta": cfg.rope_theta}


def _write_rope_scaling(cfg: ModelConfig) -> dict | None:
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
    raise refuse_export(cfg, "rope_scaling", "yarn's mscale without mscale_all_dim is fixed at 1 in transformers")
  return out


def write_common(cfg: ModelConfig, architecture: str, model_type: str) -> dict:
  """The `config.json` fields every family writes alike."""
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
    "rope_parameters": write_rope_parameters(cfg),
    "attention_bias": False,
    "attention_dropout": 0.0,
  }
