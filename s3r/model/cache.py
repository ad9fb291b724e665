"""The key/value cache of generation (s3r.model.generation) for every decoder family.

A `Cache` holds L slots per example: what each layer's attention keeps per position (its block's
`cache_shapes`: keys and values [K, H] each for the GQA families, the normalized latent [C] and
the shared RoPE key [1, R] for DeepSeek-V2's MLA), stacked over the layers like the blocks'
parameters ([n_layers, B, L, ...] per name), and the position of the token in each slot
(-1: empty, or padding). Prompts are left-padded, so every example writes the same slots: the
prompt fills 0..S-1 and decode step t slot S + t.

A `Step` is the view one forward pass (prefill or decode) traces through the blocks: the new
tokens' positions (RoPE), `write` (the layer's new entries into its slots, returning all L; the
layer index may be traced, as in the decoder's scan, which carries the entries through) and
`mask` (which slots each new token attends to: filled, at a position not after its own, and within
Gemma's sliding window on local layers). Gemma's local layers keep all L slots and mask the ones
outside the window (a ring buffer of `sliding_window` slots would save memory, not change results).

Dimension letters: N layers, B batch, S new tokens, L cache slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from s3r.model.config import ModelConfig
from s3r.model.transformer import block_class


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cache:
  """The cached entries of every layer and the position held by each slot (a pytree)."""

  layers: dict[str, jax.Array]  # name -> [N, B, L, ...] in the activation dtype (row l: layer l)
  slot_pos_BxL: jax.Array  # int32: the position of the token in each slot; -1 for an empty or padding slot


def empty(cfg: ModelConfig, batch: int, length: int) -> Cache:
  """A cache of `length` empty slots per example for the family of `cfg`."""
  shapes = block_class(cfg).cache_shapes(cfg)
  layers = {name: jnp.zeros((cfg.n_layers, batch, length, *shape), cfg.act_dtype) for name, shape in shapes.items()}
  return Cache(layers=layers, slot_pos_BxL=jnp.full((batch, length), -1, jnp.int32))


class Step:
  """One forward pass over S new tokens written at slots index..index+S-1 (see the module doc)."""

  def __init__(self, cache: Cache, index: jax.Array, positions_BxS: jax.Array, valid_BxS: jax.Array):
    self.index = index
    self.positions_BxS = positions_BxS
    self._layers = dict(cache.layers)
    new_BxS = jnp.where(valid_BxS, positions_BxS, -1).astype(jnp.int32)
    self._slot_pos_BxL = jax.lax.dynamic_update_slice_in_dim(cache.slot_pos_BxL, new_BxS, index, axis=1)

  def write(self, layer, name: str, x_BxSx_: jax.Array) -> jax.Array:
    """Stores the new tokens' `name` entries of `layer` (an int, or a traced int32 scalar); returns
    that entry of all L slots [B, L, ...]."""
    slots_NxBxLx_ = self._layers[name]
    start = (layer, 0, self.index) + (0,) * (slots_NxBxLx_.ndim - 3)
    start = tuple(jnp.asarray(i, jnp.int32) for i in start)
    slots_NxBxLx_ = jax.lax.dynamic_update_slice(slots_NxBxLx_, x_BxSx_[None].astype(slots_NxBxLx_.dtype), start)
    self._layers[name] = slots_NxBxLx_
    return jax.lax.dynamic_index_in_dim(slots_NxBxLx_, layer, axis=0, keepdims=False)

  def entries(self) -> dict[str, jax.Array]:
    """The stacked entries as written so far (what the decoder's scan carries from layer to layer)."""
    return dict(self._layers)

  def set_entries(self, entries: dict[str, jax.Array]) -> None:
    """Replaces the stacked entries (the scan's carry, inside and after its body)."""
    self._layers = dict(entries)

  def mask(self, window: int | None = None) -> jax.Array:
    """[B, 1, S, L] bool: slot l holds a token at or before new token s (within `window` positions, self included)."""
    query_BxSx1, slot_Bx1xL = self.positions_BxS[:, :, None], self._slot_pos_BxL[:, None, :]
    allowed = (slot_Bx1xL >= 0) & (slot_Bx1xL <= query_BxSx1)
    if window is not None:
      allowed = allowed & (query_BxSx1 - slot_Bx1xL < window)
    return allowed[:, None]

  def cache(self) -> Cache:
    """The cache after this step's writes."""
    return Cache(layers=self._layers, slot_pos_BxL=self._slot_pos_BxL)
