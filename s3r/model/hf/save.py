"""Writing an s3r model as a Hugging Face checkpoint folder: `save_hf(path, config, params)`.

The folder holds what `transformers.AutoModelForCausalLM.from_pretrained` reads: `config.json`
(s3r.model.hf.hub_config), the weights under their Hub names in the family's layout (the inverse
of the import's layouts, s3r.model.hf.tensors; routed experts one tensor per expert) in one
`model.safetensors`, or in shards `model-0000i-of-0000n.safetensors` with
`model.safetensors.index.json` above `max_shard_bytes`, and the tokenizer files when a tokenizer is
given. A Gemma 3 text tower imported from a multimodal checkpoint is written as `Gemma3ForCausalLM`.

Streaming: one parameter at a time is copied to the host, laid out, cast and written at its offset
(the headers are known from the shapes), so host memory stays near the largest parameter. The folder
is written under a temporary name beside `path` and renamed at the end: a failed export leaves nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from tokenizers import processors

from s3r.model import stack
from s3r.model.config import ModelConfig
from s3r.model.hf.checkpoint import INDEX, read_json
from s3r.model.hf.hub_config import TORCH_DTYPES, carried_config, hub_config
from s3r.model.hf.layouts import Entry
from s3r.model.hf.load import _get, hf_config, param_shapes, stacked_path
from s3r.model.hf.safetensors import SafetensorsWriter
from s3r.model.hf.tensors import tensor_map
from s3r.model.hf.tokenizer import HFTokenizer, load_hf_tokenizer
from s3r.model.transformer import init_params

SHARD_BYTES = 5 * 10**9  # the Hub's usual shard size
TOKENIZER_FILES = (  # copied from a checkpoint folder when present
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "tokenizer.model",
  "chat_template.jinja",
  "generation_config.json",
)


def save_hf(
  path: str | pathlib.Path,
  config: ModelConfig,
  params: dict,
  *,
  dtype=jnp.bfloat16,
  tokenizer: HFTokenizer | str | pathlib.Path | None = None,
  max_shard_bytes: int = SHARD_BYTES,
  source: str | pathlib.Path | None = None,
) -> pathlib.Path:
  """Writes `params` of the model `config` as a Hugging Face checkpoint folder `path`; returns it.

  dtype: of the stored weights, bfloat16 (rounded to nearest even from s3r's float32 master weights) or
    float32 (exact).
  tokenizer: a checkpoint folder whose tokenizer files are copied, an HFTokenizer written as
    tokenizer.json and a tokenizer_config.json naming its BOS/EOS tokens, or None (no tokenizer files).
  max_shard_bytes: larger weights are split into shards of at most this size (a single tensor may exceed it).
  source: the checkpoint folder the model was imported from (`load_hf`): its `config.json` is carried
    through, every field unchanged but those `config` changed (`hub_config.carried_config`); None: the
    file is written from `config` alone.

  ValueError (one line) for a `path` that exists and is not an empty folder, params that do not match
  `config` (naming the parameter) or a config that `transformers` cannot compute.
  """
  path = pathlib.Path(path)
  if path.exists() and not (path.is_dir() and not any(path.iterdir())):
    raise ValueError(f"{path} exists and is not an empty folder; export into a new one")
  np_dtype = np.dtype(dtype)
  if np_dtype.name not in TORCH_DTYPES:
    raise ValueError(f"dtype must be bfloat16 or float32, got {np_dtype.name}")
  tok = load_hf_tokenizer(tokenizer) if isinstance(tokenizer, str | pathlib.Path) else tokenizer
  ids = {"bos_id": tok.bos_id, "eos_id": tok.eos_id} if tok is not None else {}
  if source is None:
    hub = hub_config(config, dtype=np_dtype.name, **ids)
  else:
    source_json = pathlib.Path(source) / "config.json"
    hub = carried_config(read_json(source_json), hf_config(source), config, dtype=np_dtype.name)
  entries = _hub_order(tensor_map(config, set()))
  if stack.UNSTACKED in params:  # the per-layer layout (older checkpoints)
    params = stack.stack(params, config)
  _check_params(config, params)
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  try:
    (tmp / "config.json").write_text(json.dumps(hub, indent=2, sort_keys=True) + "\n")  # as transformers writes
    _write_weights(tmp, config, params, entries, np_dtype, max_shard_bytes)
    if isinstance(tokenizer, str | pathlib.Path):
      copy_tokenizer_files(tokenizer, tmp)
    elif tok is not None:
      _write_tokenizer(tmp, tok, config.max_seq_len)
    if path.exists():
      path.rmdir()  # empty (checked above)
    os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


def copy_tokenizer_files(source: str | pathlib.Path, destination: pathlib.Path) -> None:
  """Copies the TOKENIZER_FILES that the checkpoint folder `source` has into `destination` (created)."""
  destination.mkdir(parents=True, exist_ok=True)
  for name in TOKENIZER_FILES:
    if (pathlib.Path(source) / name).is_file():
      shutil.copyfile(pathlib.Path(source) / name, destination / name)


def _hub_order(entries: list[Entry]) -> list[Entry]:
  """The entries in the order of `transformers`' state dict: embeddings, the layers, final norm, logits head."""
  rank = {"embed": 0, "blocks": 1, "final_norm": 2, "out": 3}
  return sorted(entries, key=lambda e: rank[e.path[0]])  # stable: the layers keep their order


def _check_params(config: ModelConfig, params: dict) -> None:
  abstract = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  for path, want in jax.tree_util.tree_flatten_with_path(abstract)[0]:
    keys = tuple(k.key for k in path)
    where = "/".join(map(str, keys))
    try:
      leaf = _get(params, keys)
    except (KeyError, IndexError, TypeError):
      raise ValueError(f"params have no {where}, which {type(config).__name__} has") from None
    if tuple(leaf.shape) != tuple(want.shape):
      raise ValueError(f"params {where} has shape {list(leaf.shape)}; the config implies {list(want.shape)}")


def _layer_leaf(config: ModelConfig, params: dict, path: tuple):
  """The parameter at `path` of the per-layer layout (one layer's row of a stacked parameter: a copy of
  that row only), from the stacked params."""
  leaf = _get(params, stacked_path(config, path))
  return leaf if path[0] != stack.UNSTACKED else leaf[stack.locate(config, path[1])[1]]


def _shards(specs: list[tuple[str, tuple, int]], limit: int) -> list[list[str]]:
  """The tensor names of each shard: consecutive tensors while their bytes stay within `limit`."""
  shards: list[list[str]] = [[]]
  size = 0
  for name, _, nbytes in specs:
    if shards[-1] and size + nbytes > limit:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += nbytes
  return shards


def _write_weights(
  folder: pathlib.Path, config: ModelConfig, params: dict, entries: list[Entry], dtype: np.dtype, limit: int
) -> None:
  shapes = param_shapes(config)
  specs = [
    (name, shape, int(np.prod(shape)) * dtype.itemsize)
    for entry in entries
    for name, shape in zip(entry.hub, entry.layout.hub_shapes(shapes[entry.path]))
  ]
  shards = _shards(specs, limit)
  files = (
    ["model.safetensors"]
    if len(shards) == 1
    else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  )
  shape_of = {name: tuple(shape) for name, shape, _ in specs}
  writers = [SafetensorsWriter(folder / f, {n: (shape_of[n], dtype) for n in names}) for f, names in zip(files, shards)]
  writer_of = {name: w for w, names in zip(writers, shards) for name in names}
  try:
    for entry in entries:
      host = np.asarray(jax.device_get(_layer_leaf(config, params, entry.path)))
      for name, array in zip(entry.hub, entry.layout.to_hub(host)):
        writer_of[name].write(name, np.asarray(array, dtype=dtype))
      del host
    for w in writers:
      w.finish()
  finally:
    for w in writers:
      w.close()
  if len(files) > 1:
    weight_map = {name: f for f, names in zip(files, shards) for name in sorted(names)}
    index = {"metadata": {"total_size": sum(n for _, _, n in specs)}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(folder: pathlib.Path, tok: HFTokenizer, max_len: int) -> None:
  """tokenizer.json and a tokenizer_config.json naming the BOS/EOS tokens, for `transformers`' fast tokenizer."""
  token = lambda i: None if i is None else tok.hf.id_to_token(i)
  hf = tok.hf
  if tok.add_bos and tok.bos_id is not None:  # the post-processor adds BOS, as `add_bos_token` says
    hf = tokenizers.Tokenizer.from_str(tok.hf.to_str())
    bos = token(tok.bos_id)
    hf.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)]
    )
  hf.save(str(folder / "tokenizer.json"))
  config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": token(tok.bos_id),
    "eos_token": token(tok.eos_id),
    "add_bos_token": tok.add_bos and tok.bos_id is not None,
    "model_max_length": max_len,
  }
  (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
