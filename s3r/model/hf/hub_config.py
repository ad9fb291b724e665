"""An s3r model config -> the `config.json` of its family's `transformers` class (the inverse of
s3r.model.hf.configs: `hf_config` of the written file gives the config back).

Each family writes its own fields (`Family.writer`, s3r.model.families; the shared ones in
s3r.model.hf.fields). The file is written in the form current `transformers` (5.x) writes: RoPE as
`rope_parameters` (one dict with `rope_type` and `rope_theta`, per layer type for Gemma 3),
Qwen3-MoE's expert count as `num_local_experts`. `carried_config` writes the config of a checkpoint
imported from a folder: that folder's `config.json` with every field carried through unchanged but
those that training changed (e.g. the layer count of `--init-layers`), in that form. Fields of s3r's
training (recipe, remat, sharding, MoE capacity and dispatch, init_std) have no place in the file;
an s3r config that a `transformers` model cannot compute (e.g. a Qwen3-MoE with shared experts) is
refused with a ValueError naming the field.
"""

from __future__ import annotations

from s3r.model import families
from s3r.model.config import ModelConfig

TORCH_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}  # numpy dtype name -> config.json "dtype"


def hub_config(cfg: ModelConfig, *, dtype: str, bos_id: int | None = None, eos_id: int | None = None) -> dict:
  """The `config.json` dict of `cfg` for weights stored in `dtype` ("bfloat16" or "float32")."""
  family = families.FAMILIES.get(cfg.family)
  if family is None or family.config is not type(cfg):  # exactly a family's class: a subclass may compute more
    names = ", ".join(f.config.__name__ for f in families.FAMILIES.values())
    raise ValueError(f"{type(cfg).__name__} is not a family s3r exports ({names})")
  out = family.writer(cfg)
  return {**out, "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": TORCH_DTYPES[dtype], "torch_dtype": dtype}


# older spellings of fields `hub_config` writes in the current form (the current key: the older ones)
_LEGACY_KEYS = {
  "rope_parameters": ("rope_theta", "rope_scaling", "rope_local_base_freq"),
  "num_local_experts": ("num_experts",),
}


def carried_config(source: dict, imported: ModelConfig, cfg: ModelConfig, *, dtype: str) -> dict:
  """The `config.json` dict of `cfg`, a model imported as `imported` from a folder whose `config.json` is
  `source`: every field of `source` unchanged, but those whose value `cfg` changed (as `hub_config` writes
  them: the layer count and what follows from it, the context length, ...), the older spellings of
  `_LEGACY_KEYS` in the current form, a `layer_types` list cut to the layer count, and the stored dtype."""
  before, after = hub_config(imported, dtype=dtype), hub_config(cfg, dtype=dtype)
  if isinstance(source.get("text_config"), dict):  # a multimodal checkpoint: its text model is the causal LM
    top = {k: source[k] for k in ("transformers_version",) if k in source}
    source = {**top, **source["text_config"], "architectures": before["architectures"]}
  out = dict(source)
  for current, legacy in _LEGACY_KEYS.items():
    if current in after and any(key in out for key in legacy):
      out = {k: v for k, v in out.items() if k not in legacy}
      out.setdefault(current, after[current])
  skip = {"bos_token_id", "eos_token_id", "dtype", "torch_dtype"}
  out.update({k: v for k, v in after.items() if k not in skip and v != before.get(k)})
  if isinstance(out.get("layer_types"), list):
    out["layer_types"] = out["layer_types"][: cfg.n_layers]
  out["dtype"] = TORCH_DTYPES[dtype]
  if "torch_dtype" in source:
    out["torch_dtype"] = dtype
  return out
