"""The registry of decoder families: `FAMILIES` (name -> `s3r.model.families.base.Family`) and the
lookups every dispatch on a family goes through.

`s3r.model.families` registers each family module's `FAMILY` here once, in its order; the decoder's
block (`s3r.model.transformer`), the generation settings (`s3r.model.generation`), `config.json`
reading and writing and the tensor mapping of the Hugging Face import and export (`s3r.model.hf`),
the presets (`s3r.model.presets`) and a config file's `family` field (`ModelConfig.from_dict`) look
a family up here. This module imports nothing of s3r, so that the shared config base can look a
family up without importing the families that derive from it.
"""

from __future__ import annotations

from typing import Any

FAMILIES: dict[str, Any] = {}  # family name -> Family, in registration order
"""Every decoder family by name (a config file's `family` field)."""


def register(family: Any) -> Any:
  """Adds `family` (a `Family`) under its name; a name is registered once."""
  if family.name in FAMILIES:
    raise ValueError(f"model family {family.name!r} is already registered")
  FAMILIES[family.name] = family
  return family


def family_of(cfg: Any) -> Any:
  """The family of a config (or config class); a subclass of a family's config belongs to that family."""
  cls = cfg if isinstance(cfg, type) else type(cfg)
  for base in cls.__mro__:
    for family in FAMILIES.values():
      if family.config is base:
        return family
  raise TypeError(f"{cls.__name__} is not a ModelConfig of a registered family ({', '.join(FAMILIES)})")


def config_class(name: str) -> type:
  """The config class of the family named `name` (a config file's `family` field)."""
  if name not in FAMILIES:
    raise ValueError(f"unknown model family {name!r}; families: {', '.join(FAMILIES)}")
  return FAMILIES[name].config


def readers() -> dict[str, Any]:
  """`transformers` architecture name -> the `config.json` reader of its family, over every family."""
  return {arch: read for family in FAMILIES.values() for arch, read in family.readers.items()}
