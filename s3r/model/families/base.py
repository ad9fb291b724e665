"""The record of one decoder family: everything s3r dispatches on a family's config class.

A family is one module `s3r.model.families.<name>` that ends in its `FAMILY`, registered once in
the registry (`s3r.model.registry.FAMILIES`); the decoder takes its block from it
(s3r.model.transformer), generation its inference settings (s3r.model.generation), the Hugging Face
import and export its `config.json` reader and writer and its tensor mapping (s3r.model.hf), and
`s3r.model.presets` its presets. docs/extending.md lists the steps for a new family.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from s3r.model.config import ModelConfig
from s3r.model.hf.fields import Fields
from s3r.model.hf.layouts import Entry
from s3r.model.layers import Block

Reader = Callable[[Fields], ModelConfig]  # a `config.json` (as Fields) -> the family's s3r config
Writer = Callable[[Any], dict]  # the family's s3r config -> its `config.json` dict (without token ids and dtype)
# (config, layer, Hub name prefix of the layer, experts fused?) -> the entries of the layer's parameters
BlockTensors = Callable[[Any, int, str, bool], list[Entry]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
  """One decoder family: its config class, its block, its Hugging Face conversion and its presets.

  config: the frozen config class; `config.family` is the family's name (config files, presets).
  block: the block module (s3r.model.layers.Block or a subclass), built as block(cfg, key, layer).
  readers: `transformers` architecture name -> the reader of a `config.json` naming it.
  writer: the `config.json` of an s3r config of exactly this class (the inverse of the first reader).
  block_tensors: where each parameter of one layer lives in a checkpoint (s3r.model.hf.layouts).
  presets: preset name -> config of exactly this class (published sizes, CPU-sized ones), in listing order.
  sibling: the CPU-sized preset that stands for the family in tests and CPU runs (one of `presets`).
  inference: config fields that generation replaces (e.g. dropless MoE routing).
  """

  config: type[ModelConfig]
  block: type[Block]
  readers: Mapping[str, Reader]
  writer: Writer
  block_tensors: BlockTensors
  presets: Mapping[str, ModelConfig]
  sibling: str
  inference: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

  def __post_init__(self):
    if not (isinstance(self.config, type) and issubclass(self.config, ModelConfig)):
      raise TypeError(f"Family.config must be a ModelConfig subclass, got {self.config!r}")
    if not (isinstance(self.block, type) and issubclass(self.block, Block)):
      raise TypeError(f"Family.block must be a Block subclass, got {self.block!r}")
    if not self.readers:
      raise ValueError(f"Family.readers of {self.name!r} names no architecture")
    foreign = [name for name, cfg in self.presets.items() if type(cfg) is not self.config]
    if foreign:
      raise TypeError(f"Family.presets of {self.name!r}: {foreign} are not of exactly {self.config.__name__}")
    if self.sibling not in self.presets:
      raise ValueError(f"Family.sibling of {self.name!r}: {self.sibling!r} is not one of its presets")
    unknown = set(self.inference) - {f.name for f in dataclasses.fields(self.config)}
    if unknown:
      raise ValueError(f"Family.inference of {self.name!r}: {self.config.__name__} has no field {sorted(unknown)}")

  @property
  def name(self) -> str:
    return self.config.family

  @property
  def architecture(self) -> str:
    """The architecture name the export writes (the first reader's)."""
    return next(iter(self.readers))
