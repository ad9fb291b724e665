"""Qwen3 dense: the Llama block with per-head RMSNorm of queries and keys (`Qwen3ForCausalLM`).

| preset             | layers | width | params          | active         |
|--------------------|--------|-------|-----------------|----------------|
| `qwen3-8b`         | 36     | 4096  | 8,190,735,360   | 8,190,735,360  |
| `qwen3-tiny`       | 2      | 64    | 164,224         | 164,224        |

`qwen3-8b` has the published dimensions (docs/models.md); `qwen3-tiny` is its structure at width 64.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from s3r.model.config import ModelConfig
from s3r.model.families.base import Family
from s3r.model.families.llama import TINY
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, rope, rope_parameters, write_common
from s3r.model.layers import Block


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config(ModelConfig):
  """Qwen3 dense: the Llama block plus RMSNorm of each query and key head (QK-norm)."""

  family: ClassVar[str] = "qwen3"

  def norm_params(self) -> int:
    return 2 * self.d_model + 2 * self.head_dim


class Qwen3Block[C: ModelConfig](Block[C]):
  """Llama block with per-head RMSNorm of queries and keys (over the head dim H, before RoPE).
  Dimension letters: B batch, S sequence, N query heads, K key/value heads, H head dim."""

  def __init__(self, cfg: C, key, layer: int = 0):
    super().__init__(cfg, key, layer)
    self.q_norm = self._norm(cfg.head_dim)
    self.k_norm = self._norm(cfg.head_dim)

  def _qk(self, q_BxSxNxH, k_BxSxKxH):
    return self.q_norm(q_BxSxNxH), self.k_norm(k_BxSxKxH)


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


PRESETS = {
  "qwen3-8b": Qwen3Config(
    vocab_size=151936,
    d_model=4096,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    d_head=128,
    d_ff=12288,
    max_seq_len=40960,
    rope_theta=1_000_000.0,
  ),
  "qwen3-tiny": Qwen3Config(**{**TINY, "d_head": 16}, rope_theta=1_000_000.0),
}

FAMILY = Family(
  config=Qwen3Config,
  block=Qwen3Block,
  readers={"Qwen3ForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  presets=PRESETS,
  sibling="qwen3-tiny",
)
