"""The presets of every registered family, `preset()` and parameter counts.

Each family's module (`s3r.model.families.<name>`) holds its presets, with a table of their
parameter counts: published dimensions (references in docs/models.md), a CPU-sized sibling of each
family, and the original toy and training presets. `PRESETS` shows them in the registry's order
(`s3r models` lists them). `params` is the total, `active` the parameters one token uses (all but
the routed experts it is not sent to); both checked in tests/model. The CLI may replace
`vocab_size` by the tokenizer's; the counts are at each preset's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from s3r.model.config import ModelConfig, MoeFields
from s3r.model.families import FAMILIES


def _gathered() -> dict[str, ModelConfig]:
  out: dict[str, ModelConfig] = {}
  for family in FAMILIES.values():
    for name, cfg in family.presets.items():
      if name in out:
        raise ValueError(f"preset {name!r} of family {family.name!r} is already a preset of {out[name].family!r}")
      out[name] = cfg
  return out


class _Presets(Mapping[str, ModelConfig]):
  """Preset name -> config over every registered family, in the registry's order: a view of the registry
  (a family registered later shows here too)."""

  def __getitem__(self, name: str) -> ModelConfig:
    return _gathered()[name]

  def __iter__(self) -> Iterator[str]:
    return iter(_gathered())

  def __len__(self) -> int:
    return len(_gathered())

  def __repr__(self) -> str:
    return f"PRESETS({', '.join(self)})"


PRESETS: Mapping[str, ModelConfig] = _Presets()
"""The model presets by name (`s3r train --preset`, `preset(name)`): small shapes for the CPU and the
shapes of the released models."""
OVERRIDES = {"layers": "n_layers", "seq": "max_seq_len", "width": "d_model"}  # short names accepted by preset()


def preset(name: str, **overrides) -> ModelConfig:
  """The preset `name` with fields replaced by `overrides`: any config field (vocab_size, recipe, ...) or
  the short names layers (n_layers), seq (max_seq_len) and width (d_model; a family with its own d_head keeps it)."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
  base = PRESETS[name]
  fields = {OVERRIDES.get(k, k): v for k, v in overrides.items()}
  if isinstance(base, MoeFields) and "n_layers" in fields:
    fields.setdefault("dense_layers", min(base.dense_layers, fields["n_layers"]))
  return dataclasses.replace(base, **fields)


def param_count(cfg: ModelConfig) -> int:
  """Number of trainable parameters (from the config's arithmetic; equals the initialized shapes)."""
  return _counts(cfg)[0]


def active_param_count(cfg: ModelConfig) -> int:
  """Parameters one token uses: all but the routed experts it is not sent to (embeddings included)."""
  return _counts(cfg)[1]


def _counts(cfg: ModelConfig) -> tuple[int, int]:
  embed = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.d_model  # + final norm
  total = active = embed
  for layer in range(cfg.n_layers):
    ffn_total, ffn_active = cfg.ffn_params(layer)
    shared = cfg.attention_params() + cfg.norm_params()
    total, active = total + shared + ffn_total, active + shared + ffn_active
  return total, active
