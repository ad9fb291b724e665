"""`config.json` of a Hugging Face checkpoint -> the s3r model config of its family.

The `architectures` entry picks the family (s3r.model.families: each family's reader of its
architectures); the fields the families share are read in s3r.model.hf.fields. Every field of each
architecture's `transformers` config class is either honoured exactly, irrelevant to the computed
function (token ids, cache and initialization settings, the storage dtype), or refused with an
HFConfigError naming the field and its value when it asks for something s3r does not compute
(docs/models.md lists the fields). Keys the config class does not have are ignored, as
`transformers` ignores them, except the DeepSeek remote-code keys that change that code's function
(moe_layer_freq, scoring_func). Both the current `rope_parameters` and the older `rope_theta` +
`rope_scaling` spellings are read.
"""

from __future__ import annotations

from s3r.model import families
from s3r.model.config import ModelConfig
from s3r.model.hf.errors import HFConfigError
from s3r.model.hf.fields import Fields


def architecture(hf: dict, source: str) -> str:
  """The one architecture of `config.json` that s3r imports; HFConfigError otherwise."""
  names, known = hf.get("architectures"), ", ".join(families.readers())
  if not isinstance(names, list) or len(names) != 1:
    raise HFConfigError(f"{source}: architectures={names!r}: expected one of {known}")
  if names[0] not in families.readers():
    raise HFConfigError(f"{source}: architectures={names!r}: s3r imports {known}")
  return names[0]


def model_config(hf: dict, source: str) -> ModelConfig:
  """The s3r config of the checkpoint's `config.json` (already parsed; `source` names it in errors)."""
  f = Fields(hf, source)
  try:
    return families.readers()[architecture(hf, source)](f)
  except HFConfigError:
    raise
  except (TypeError, ValueError) as e:  # a field of the wrong type, or an s3r config check
    raise HFConfigError(f"{source}: {e}") from None
