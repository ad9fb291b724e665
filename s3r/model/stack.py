"""The stacked layout of the decoder's blocks: what the params tree holds and how to convert.

The decoder keeps its blocks as a few *segments*, each one block module whose parameters carry a
leading layer axis (stacked), so that the forward pass can run a segment as one `jax.lax.scan`
(XLA compiles one block, whatever the depth):

| segment        | layers                          | families                                 |
|----------------|---------------------------------|------------------------------------------|
| `dense_layers` | 0 .. dense_layers - 1           | Qwen3-MoE, DeepSeek-V2 with dense_layers |
| `layers`       | the others (all, without MoE)   | every family                             |

Parameter `params["layers"]["q"]` is [n, D, N·H]: row i belongs to layer `start + i`. The layer axis
is never sharded (logical axis None). Layer l keeps its key `fold_in(step_key, l)` whether its
segment runs scanned or unrolled.

The earlier layout, one subtree per layer under `params["blocks"][l]`, is what Hugging Face
checkpoints and checkpoints of older runs hold: `stack` and `unstack` convert between the two
(exactly: stacking copies values), on arrays, host arrays or `jax.ShapeDtypeStruct`s (shardings
included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from s3r.model.config import ModelConfig, MoeFields

SEGMENT_NAMES = ("dense_layers", "layers")  # keys of the stacked segments in the params tree, in layer order
UNSTACKED = "blocks"  # key of the per-layer layout: params["blocks"][l]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Segment:
  """Layers start .. start + count - 1, stacked under params[name]."""

  name: str
  start: int
  count: int


def segments(cfg: ModelConfig) -> tuple[Segment, ...]:
  """The stacked segments of `cfg`'s decoder, in layer order (each non-empty)."""
  dense = cfg.dense_layers if isinstance(cfg, MoeFields) else 0
  out = []
  if dense:
    out.append(Segment(name="dense_layers", start=0, count=dense))
  if cfg.n_layers > dense:
    out.append(Segment(name="layers", start=dense, count=cfg.n_layers - dense))
  return tuple(out)


def segment(cfg: ModelConfig, name: str) -> Segment:
  """The segment of `cfg` named `name`."""
  return next(seg for seg in segments(cfg) if seg.name == name)


def locate(cfg: ModelConfig, layer: int) -> tuple[str, int]:
  """(segment name, row in its stack) of layer `layer`."""
  for seg in segments(cfg):
    if seg.start <= layer < seg.start + seg.count:
      return seg.name, layer - seg.start
  raise IndexError(f"layer {layer} is outside the model's {cfg.n_layers} layers")


def is_stacked_path(path: tuple) -> bool:
  """Whether a params-tree path (of keys) leads into a stacked segment."""
  return bool(path) and path[0] in SEGMENT_NAMES


def per_layer_ndim(params: dict) -> dict:
  """The tree of each leaf's number of dims as one layer sees it (a stacked leaf: one less)."""
  key = lambda k: getattr(k, "key", k)
  return jax.tree_util.tree_map_with_path(lambda path, x: x.ndim - is_stacked_path(tuple(map(key, path[:1]))), params)


def _stack_leaves(*leaves):
  first = leaves[0]
  if isinstance(first, jax.ShapeDtypeStruct):
    sharding = first.sharding
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(sharding.mesh, P(None, *sharding.spec))
    return jax.ShapeDtypeStruct((len(leaves), *first.shape), first.dtype, sharding=sharding)
  if isinstance(first, np.ndarray):
    return np.stack(leaves)
  return jnp.stack(leaves)


def _row(i: int) -> Callable:
  def take(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      sharding = x.sharding
      if isinstance(sharding, NamedSharding):
        sharding = NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[1:]))
      return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)
    return x[i]

  return take


def stack(params: dict, cfg: ModelConfig) -> dict:
  """The stacked layout of a params tree in the per-layer layout (`params["blocks"][l]`); other
  entries are kept as they are."""
  out = {k: v for k, v in params.items() if k != UNSTACKED}
  blocks = params[UNSTACKED]
  for seg in segments(cfg):
    rows = [blocks[layer] for layer in range(seg.start, seg.start + seg.count)]
    out[seg.name] = jax.tree.map(_stack_leaves, *rows)
  return out


def unstack(params: dict, cfg: ModelConfig) -> dict:
  """The per-layer layout (`params["blocks"][l]`) of a stacked params tree."""
  out = {k: v for k, v in params.items() if k not in SEGMENT_NAMES}
  out[UNSTACKED] = {}
  for seg in segments(cfg):
    for i in range(seg.count):
      out[UNSTACKED][seg.start + i] = jax.tree.map(_row(i), params[seg.name])
  return out


def _is_params(x) -> bool:
  return isinstance(x, dict) and any(name in x for name in SEGMENT_NAMES)


def _is_unstacked(x) -> bool:
  return isinstance(x, dict) and UNSTACKED in x


def unstack_all(tree, cfg: ModelConfig):
  """`tree` (e.g. a TrainState: params and the optimizer's params-shaped moments) with every stacked
  params tree in it unstacked."""
  return jax.tree.map(lambda x: unstack(x, cfg) if _is_params(x) else x, tree, is_leaf=_is_params)


def stack_all(tree, cfg: ModelConfig):
  """`tree` with every per-layer params tree in it stacked (the inverse of `unstack_all`)."""
  return jax.tree.map(lambda x: stack(x, cfg) if _is_unstacked(x) else x, tree, is_leaf=_is_unstacked)
