"""The decoder families, one module each, registered once in `FAMILIES` (name -> `Family`).

Every dispatch on a family goes through this registry: the decoder's block
(`s3r.model.transformer`), the generation settings (`s3r.model.generation`), `config.json`
reading and writing and the tensor mapping of the Hugging Face import and export
(`s3r.model.hf`), and a config file's `family` field (`ModelConfig.from_dict`).
"""

from __future__ import annotations

from s3r.model.config import ModelConfig
from s3r.model.families import deepseek_v2, gemma3, llama, qwen3, qwen3_moe
from s3r.model.families.base import Family, Reader

FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in (llama, qwen3, gemma3, qwen3_moe, deepseek_v2)}
"""Every decoder family by name (a config file's `family` field)."""


def family_of(cfg: ModelConfig | type[ModelConfig]) -> Family:
  """The family of a config (or config class); a subclass of a family's config belongs to that family."""
  cls = cfg if isinstance(cfg, type) else type(cfg)
  for base in cls.__mro__:
    for family in FAMILIES.values():
      if family.config is base:
        return family
  raise TypeError(f"{cls.__name__} is not a ModelConfig of a registered family ({', '.join(FAMILIES)})")


def config_class(name: str) -> type[ModelConfig]:
  """The config class of the family named `name` (a config file's `family` field)."""
  if name not in FAMILIES:
    raise ValueError(f"unknown model family {name!r}; families: {', '.join(FAMILIES)}")
  return FAMILIES[name].config


def readers() -> dict[str, Reader]:
  """`transformers` architecture name -> the `config.json` reader of its family, over every family."""
  return {arch: read for family in FAMILIES.values() for arch, read in family.readers.items()}
