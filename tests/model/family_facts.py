"""The test facts of every registered family, gathered for the tests that run over every family.

Each family `s3r/model/families/<name>.py` has its facts in `tests/model/families/<name>.py`: the
published parameter counts and `config.json`s of its checkpoints, the Hugging Face fields it refuses,
configs it must refuse, its tokenizer's BOS convention, and which of its runs the default suite
makes. A registered family without that module fails every test that reads this one.
"""

from __future__ import annotations

import importlib

from s3r import model as M

FACTS = {name: importlib.import_module(f"tests.model.families.{name}") for name in M.FAMILIES}
SIBLINGS = [family.sibling for family in M.FAMILIES.values()]  # one CPU-sized preset per family
TINY = [name for name, cfg in M.PRESETS.items() if cfg.d_model <= 64]  # every CPU-sized preset of width 64


def gathered(field: str) -> list:
  """The family facts' lists named `field`, one after the other in registry order."""
  return [item for facts in FACTS.values() for item in getattr(facts, field)]


def merged(field: str) -> dict:
  """The family facts' dicts named `field` (keyed by preset) in one dict."""
  return {key: value for facts in FACTS.values() for key, value in getattr(facts, field).items()}


def of_sibling(preset: str):
  """The facts of the family whose sibling is `preset`."""
  return FACTS[M.PRESETS[preset].family]
