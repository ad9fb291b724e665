"""Loading a Hugging Face checkpoint folder into an s3r config and params tree, streaming.

Every tensor's presence and shape is checked from the file headers before any data is read. Then
the parameters are made one at a time: the Hub tensor(s) memory-mapped, laid out as s3r stores it
and cast into the target dtype in one host copy, placed on its sharding (or the default device),
and the host copy dropped. Host memory therefore stays near the largest single parameter (for MoE,
one layer's stacked experts) plus what the placement holds, never a second copy of the model.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from s3r.model import stack, transformer
from s3r.model.config import ModelConfig
from s3r.model.hf import configs
from s3r.model.hf.checkpoint import Checkpoint, read_json
from s3r.model.hf.errors import HFConfigError, HFError
from s3r.model.hf.layouts import Entry
from s3r.model.hf.tensors import tensor_map, text_prefix

_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")  # buffers some older checkpoints store


def hf_config(path: str | pathlib.Path, **overrides) -> ModelConfig:
  """The s3r config of the checkpoint folder's `config.json`, with `overrides` (any config field,
  e.g. recipe=..., n_layers=2 to import the first layers only) replaced. Reads no weights."""
  source = pathlib.Path(path) / "config.json"
  cfg = configs.model_config(read_json(source), str(source))
  unknown = set(overrides) - {f.name for f in dataclasses.fields(cfg)}
  if unknown:
    raise ValueError(f"{type(cfg).__name__} has no field {', '.join(sorted(unknown))}")
  return dataclasses.replace(cfg, **overrides) if overrides else cfg


def load_hf(
  path: str | pathlib.Path, *, dtype=jnp.float32, shardings: dict | None = None, **overrides
) -> tuple[ModelConfig, dict]:
  """(s3r config, params) of a Hugging Face checkpoint folder (`config.json` + safetensors, one file
  or sharded with `model.safetensors.index.json`).

  dtype: of the parameters (float32: s3r's master weights; a bf16 checkpoint converts exactly).
  shardings: a tree of `jax.sharding.Sharding` with the params' structure (e.g. from the run's mesh);
    each parameter is placed directly on its sharding. None: the default device.
  overrides: config fields replaced as in `hf_config` (n_layers=N reads the first N layers only).

  Raises HFConfigError for a config field s3r does not compute exactly, HFError for a missing or
  malformed file or tensor (each one line naming the file, tensor or field).
  """
  ckpt = Checkpoint(path)
  cfg = hf_config(path, **overrides)
  entries = tensor_map(cfg, ckpt.names)
  shapes = param_shapes(cfg)
  _check_entries(ckpt, entries, shapes)
  _check_unused(ckpt, cfg, entries, sliced="n_layers" in overrides)
  np_dtype = np.dtype(dtype)
  params: dict = {}
  stacked: dict[tuple, np.ndarray] = {}  # the host array of each stacked parameter being filled
  for entry in sorted(entries, key=lambda e: stacked_path(cfg, e.path)):  # one stacked parameter at a time
    host = entry.layout.to_s3r([ckpt.read(name) for name in entry.hub], np_dtype)
    where = stacked_path(cfg, entry.path)
    if where != entry.path:  # one layer's parameter: its row of the segment's stacked array
      segment, row = stack.locate(cfg, entry.path[1])
      count = stack.segment(cfg, segment).count
      rows = stacked.setdefault(where, np.empty((count, *host.shape), host.dtype))
      rows[row] = host
      del host
      if row < count - 1:
        continue
      host = stacked.pop(where)
    _set(params, where, _place(host, None if shardings is None else _get(shardings, where)))
    del host
  return cfg, params


def stacked_path(cfg: ModelConfig, path: tuple) -> tuple:
  """The path in s3r's (stacked) params tree of a path of the per-layer layout: ("blocks", l, *rest)
  becomes (segment, *rest) (the layer is row l - start of its segment); other paths are kept."""
  if path[0] != stack.UNSTACKED:
    return path
  return (stack.locate(cfg, path[1])[0], *path[2:])


def param_shapes(cfg: ModelConfig) -> dict[tuple, tuple[int, ...]]:
  """{path in the per-layer layout of the params tree (s3r.model.stack): shape} of the parameters of
  `cfg`, one entry per layer (from abstract values: nothing is allocated)."""
  abstract = stack.unstack(jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0))), cfg)
  leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
  return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in leaves}


def _check_entries(ckpt: Checkpoint, entries: list[Entry], shapes: dict) -> None:
  mapped = {e.path for e in entries}
  if mapped != set(shapes):  # the mapping and the model disagree: a defect of this module, not of the input
    raise RuntimeError(f"s3r.model.hf maps {sorted(mapped ^ set(shapes))} inconsistently with the model")
  for entry in entries:
    for name, want in zip(entry.hub, entry.layout.hub_shapes(shapes[entry.path])):
      got = ckpt.shape(name)  # HFError naming the tensor when it is missing
      if got != tuple(want):
        raise HFError(f"{ckpt.path}: tensor {name} has shape {list(got)}; config.json implies {list(want)}")


def _check_unused(ckpt: Checkpoint, cfg: ModelConfig, entries: list[Entry], sliced: bool) -> None:
  """Refuses a checkpoint tensor the model does not use (e.g. a bias), except the logits head of a tied
  model, the vision tower of a multimodal one and, when the layers are sliced, the layers left out."""
  prefix, head = text_prefix(ckpt.names)
  used = {name for e in entries for name in e.hub}
  layer = re.compile(re.escape(prefix) + r"layers\.(\d+)\.")
  for name in sorted(ckpt.names - used):
    if _IGNORED.search(name) or (cfg.tie_embeddings and name == head):
      continue
    if prefix != "model." and not name.startswith(prefix) and name != head:
      continue  # outside the text tower of a multimodal checkpoint
    m = layer.match(name)
    if sliced and m and int(m.group(1)) >= cfg.n_layers:
      continue
    raise HFConfigError(f"{ckpt.path}: tensor {name} has no place in the s3r model (config.json does not ask for it)")


def _place(host: np.ndarray, sharding) -> jax.Array:
  if sharding is None:
    return jax.device_put(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _get(tree: dict, path: tuple) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value
