"""Taps on a decoder's blocks, from outside the model: where the gradient diagnostics need a gradient
inside the network, a zero tensor is added there and the loss differentiated with respect to it.

Two places: each block's input (a probe: its gradient is the activation gradient entering the block)
and each block projection's output (an offset: its gradient is the projection's upstream gradient G).
The tapped model also reports each projection's input x, weight w and rounding key. It is the family's
model built with a subclass of the family's block (`s3r.model.graphdef(cfg, block=...)`): the same
parameters and numerics, and its layers run as the config says (one `jax.lax.scan` per segment by
default). The probes and offsets are variables of the tapped block, stacked over the layers as its
weights are, so the scan hands each layer its own; what a layer reports comes out of the scan with
the blocks' auxiliary outputs.

Dimension letters: B batch, S sequence, D model width, N a projection's output width.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from s3r import model as s3r_model
from s3r.model.layers import folded_keys

PROBE, OFFSETS = "tap_probe", "tap_offsets"  # the tapped block's variables


class Tap(nnx.Variable):
  """A zero tensor the tapped block adds (a probe or an offset); not a parameter of the model."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Taps:
  """What the tapped model adds and reports, one entry per layer."""

  probes: list[jax.Array] | None = None  # [B, S, D] per layer, added to the block's input
  offsets: list[dict[str, jax.Array]] | None = None  # per layer: projection name -> [B, S, N], added to its output
  record: bool = False  # report each projection's (x, w, key)


def tapped_block(base: type[s3r_model.Block], taps: Taps) -> type[s3r_model.Block]:
  """A subclass of the block class `base` with variables of the shapes of `taps`' first layer (zeros
  until `apply` fills them) that adds and reports what `taps` says."""
  probe, offsets = (taps.probes or [None])[0], (taps.offsets or [None])[0]

  class Tapped(base):
    def __init__(self, cfg, key, layer: int = 0):
      super().__init__(cfg, key, layer)
      if probe is not None:
        setattr(self, PROBE, Tap(jnp.zeros(probe.shape, cfg.act_dtype)))
      if offsets is not None:
        setattr(self, OFFSETS, nnx.data({n: Tap(jnp.zeros(o.shape, jnp.float32)) for n, o in offsets.items()}))

    def __call__(self, x_BxSxD, layer_key, cache=None, *, layer=None):
      if probe is not None:
        x_BxSxD = x_BxSxD + getattr(self, PROBE)[...]
      self._tap_seen = {}
      y_BxSxD, aux = super().__call__(x_BxSxD, layer_key, cache, layer=layer)
      return y_BxSxD, ({**aux, "projections": self._tap_seen} if taps.record else aux)

    def _proj(self, name: str, x, layer_key):
      y = super()._proj(name, x, layer_key)
      if taps.record:
        key = None if layer_key is None else folded_keys(layer_key, len(self.PROJECTIONS))[self.PROJECTIONS.index(name)]
        self._tap_seen[name] = (x, getattr(self, name)[...], key)
      if offsets is not None:
        y = y + getattr(self, OFFSETS)[name][...].astype(x.dtype)
      return y

  Tapped.__name__ = Tapped.__qualname__ = f"Tapped{base.__name__}"
  return Tapped


def apply(cfg: s3r_model.ModelConfig, params: dict, tokens_BxS: jax.Array, *, key, taps: Taps):
  """(f32 logits [B, S, V], the blocks' auxiliary dicts) of `cfg`'s model with parameters `params`,
  tapped. The dicts are those of `Transformer(aux=...)`: the MoE layers' terms, and with `taps.record`
  one per layer holding "projections": {name: (x, w, key)}. Traceable (call it inside `jax.jit`)."""
  graphdef = s3r_model.graphdef(cfg, block=tapped_block(s3r_model.block_class(cfg), taps))
  full = dict(params)
  for seg in s3r_model.stack.segments(cfg):
    rows = slice(seg.start, seg.start + seg.count)
    full[seg.name] = dict(params[seg.name])
    if taps.probes is not None:
      full[seg.name][PROBE] = jnp.stack([p.astype(cfg.act_dtype) for p in taps.probes[rows]])
    if taps.offsets is not None:
      names = taps.offsets[0]
      full[seg.name][OFFSETS] = {n: jnp.stack([o[n] for o in taps.offsets[rows]]) for n in names}
  per_layer: list[dict] = []
  logits_BxSxV = nnx.merge(graphdef, full)(tokens_BxS, key=key, aux=per_layer)
  return logits_BxSxV, per_layer
