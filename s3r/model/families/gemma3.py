"""Gemma 3: QK-norm, norms before and after each sublayer with (1 + scale), GeGLU (tanh GELU),
5 local : 1 global attention layers, the embedding scaled by sqrt(D) (`Gemma3ForCausalLM`, and the
text tower of `Gemma3ForConditionalGeneration`).

The block (dimension letters: B batch, S sequence, N query heads, K key/value heads, H head dim,
L key positions, F FFN width) is the Qwen3 block with its hooks overridden: RMSNorm with
(1 + scale) before and after each sublayer, GeGLU with the tanh-approximated GELU, attention scaled
by query_pre_attn_scalar ** -0.5; every `global_every`-th layer attends globally with RoPE base
`rope_theta` (and `rope_scaling`), the others within a causal window of `sliding_window` positions
with base `local_rope_theta` (under the decoder's scan, a `jax.lax.cond` on the layer index picks the
kind: each kind's computation is the one an unrolled layer of that kind runs).

| preset             | layers | width | params          | active         |
|--------------------|--------|-------|-----------------|----------------|
| `gemma3-12b`       | 48     | 3840  | 11,766,034,176  | 11,766,034,176 |
| `gemma3-tiny`      | 6      | 64    | 329,664         | 329,664        |

`gemma3-12b` has the published dimensions (docs/models.md); `gemma3-tiny` is its structure at width 64.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from s3r.model.config import ModelConfig, RopeScaling, check_positive
from s3r.model.families.base import Family
from s3r.model.families.llama import TINY
from s3r.model.families.qwen3 import Qwen3Block
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, rope, rope_parameters, write_common
from s3r.model.layers import RMSNorm, attend
from s3r.model.layers import rope as rotate


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config(ModelConfig):
  """Gemma 3: GeGLU, RMSNorm (1 + scale) before and after each sublayer, QK-norm, tied
  embeddings scaled by sqrt(d_model), sliding-window layers with their own RoPE base."""

  family: ClassVar[str] = "gemma3"
  norm_offset: ClassVar[bool] = True
  embed_scale: ClassVar[bool] = True

  tie_embeddings: bool = True  # Gemma ties the logits to the embedding
  sliding_window: int = 1024  # local layers attend to this many most recent positions (self included)
  global_every: int = 6  # every global_every-th layer (1-based) is global, the others local (5:1)
  local_rope_theta: float = 10_000.0  # RoPE base of the local layers (no rope_scaling)
  query_pre_attn_scalar: float = 256.0  # attention scores are scaled by query_pre_attn_scalar ** -0.5

  def __post_init__(self):
    super().__post_init__()
    check_positive(self, ("sliding_window", "global_every"))
    check_positive(self, ("local_rope_theta", "query_pre_attn_scalar"), float)

  def is_global(self, layer: int) -> bool:
    return (layer + 1) % self.global_every == 0

  def norm_params(self) -> int:
    return 4 * self.d_model + 2 * self.head_dim


class Gemma3Block(Qwen3Block[Gemma3Config]):
  """Gemma 3 block: QK-norm, sandwich norms, GeGLU, interleaved sliding-window and global attention."""

  def __init__(self, cfg: Gemma3Config, key, layer: int = 0):
    super().__init__(cfg, key, layer)
    self.post_attn_norm = self._norm(cfg.d_model)
    self.post_mlp_norm = self._norm(cfg.d_model)

  def _norm(self, dim: int) -> RMSNorm:
    return RMSNorm(dim, self.cfg.norm_eps, offset=self.cfg.norm_offset, dtype=self.cfg.act_dtype)

  def _per_kind(self, layer, global_fn, local_fn):
    """global_fn() on a global layer, local_fn() on a local one: chosen in Python for a static layer
    index, by `jax.lax.cond` (which runs only the chosen branch) for a traced one (the scanned decoder)."""
    is_global = self.cfg.is_global(self.layer if layer is None else layer)
    if isinstance(is_global, bool):
      return global_fn() if is_global else local_fn()
    return jax.lax.cond(is_global, global_fn, local_fn)

  def _rope(self, x_BxSxNxH, positions_BxS=None, layer=None):
    cfg = self.cfg
    return self._per_kind(
      layer,
      lambda: rotate(x_BxSxNxH, cfg.rope_theta, cfg.rope_scaling, positions_BxS),
      lambda: rotate(x_BxSxNxH, cfg.local_rope_theta, None, positions_BxS),
    )

  def _attend(self, q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cache=None, layer=None):
    cfg = self.cfg
    scale = cfg.query_pre_attn_scalar**-0.5
    run = lambda window: lambda: attend(q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cfg, cache, scale=scale, window=window)
    return self._per_kind(layer, run(None), run(cfg.sliding_window))

  def _act(self, gate_BxSxF):
    return jax.nn.gelu(gate_BxSxF, approximate=True)

  def _after(self, name: str, y_BxSxD):
    return (self.post_attn_norm if name == "attn" else self.post_mlp_norm)(y_BxSxD)


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


PRESETS = {
  "gemma3-12b": Gemma3Config(
    vocab_size=262208,
    d_model=3840,
    n_layers=48,
    n_heads=16,
    n_kv_heads=8,
    d_head=256,
    d_ff=15360,
    max_seq_len=131072,
    rope_theta=1_000_000.0,
    rope_scaling=RopeScaling(kind="linear", factor=8.0),
    sliding_window=1024,
    local_rope_theta=10_000.0,
    query_pre_attn_scalar=256.0,
  ),
  "gemma3-tiny": Gemma3Config(
    **{**TINY, "n_layers": 6, "d_head": 32, "d_ff": 128},
    rope_theta=1_000_000.0,
    rope_scaling=RopeScaling(kind="linear", factor=8.0),
    sliding_window=16,
    query_pre_attn_scalar=32.0,
  ),
}

FAMILY = Family(
  config=Gemma3Config,
  block=Gemma3Block,
  readers={"Gemma3ForCausalLM": read, "Gemma3ForConditionalGeneration": read_multimodal},
  writer=write,
  block_tensors=block_tensors,
  presets=PRESETS,
  sibling="gemma3-tiny",
)
