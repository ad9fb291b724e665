"""Hugging Face checkpoints of the five families into s3r: `load_hf(path)` -> (config, params),
`hf_config(path)` (the config alone), `load_hf_tokenizer(path)`; and out again: `save_hf(path,
config, params)`. Supported architectures and the treatment of every config field: docs/models.md,
"Hugging Face checkpoints"."""

from s3r.model.hf.errors import HFConfigError, HFError
from s3r.model.hf.layouts import Entry
from s3r.model.hf.load import hf_config, load_hf
from s3r.model.hf.save import save_hf
from s3r.model.hf.tensors import tensor_map
from s3r.model.hf.tokenizer import HFTokenizer, load_hf_tokenizer

__all__ = [
  "Entry",
  "HFConfigError",
  "HFError",
  "HFTokenizer",
  "hf_config",
  "load_hf",
  "load_hf_tokenizer",
  "save_hf",
  "tensor_map",
]
