"""The routed feed-forward of the MoE families (Qwen3-MoE, DeepSeek-V2): their blocks build it from
their config's `MoeFields` and call it with their layer key folded with the MoE's own index.

Dimension letters: B batch, S sequence, D model width. The families' blocks live in their modules
(s3r.model.families); the shared pieces and the Llama block in s3r.model.layers.
"""

from __future__ import annotations

import jax
from flax import nnx

from s3r.model.config import MoeFields


def moe_feed_forward(cfg: MoeFields, key: jax.Array) -> nnx.Module:
  """The routed MoE feed-forward of an MoE-family config (imported only by the MoE families)."""
  from s3r.model.moe import MoEFeedForward  # noqa: PLC0415 (dense families never need it)

  return MoEFeedForward(cfg.moe_settings, recipe=cfg.recipe, compute_dtype=cfg.act_dtype, rngs=nnx.Rngs(key))


def moe_call(moe: nnx.Module, h_BxSxD, layer_key, index: int):
  """(output, aux) of the MoE feed-forward with the layer key folded with `index`."""
  key = None if layer_key is None else jax.random.fold_in(layer_key, index)
  return moe(h_BxSxD, key)
