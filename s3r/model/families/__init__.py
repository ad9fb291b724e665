"""The decoder families, one module each, registered once in `FAMILIES` (name -> `Family`).

A family's module `s3r.model.families.<name>` holds the family whole: its config class (derived
from the shared base `s3r.model.config.ModelConfig`), its block (or what differs from the Llama
block of `s3r.model.layers`), its Hugging Face `config.json` reader and writer and tensor map, its
generation settings and its presets, gathered in its `Family` record `FAMILY`:

| module        | family        | attention                          | feed-forward                 |
|---------------|---------------|------------------------------------|------------------------------|
| `llama`       | Llama 3       | GQA, RoPE (Llama 3 scaling)        | SwiGLU                       |
| `qwen3`       | Qwen3 dense   | GQA + per-head QK-norm             | SwiGLU                       |
| `gemma3`      | Gemma 3       | GQA + QK-norm, 5 local : 1 global  | GeGLU (tanh), pre+post norms |
| `qwen3_moe`   | Qwen3-MoE     | as Qwen3                           | routed MoE                   |
| `deepseek_v2` | DeepSeek-V2   | multi-head latent attention (MLA)  | first layers dense, then MoE |

Every dispatch on a family goes through the registry (`s3r.model.registry`): the decoder's block
(`s3r.model.transformer`), the generation settings (`s3r.model.generation`), `config.json`
reading and writing and the tensor mapping of the Hugging Face import and export
(`s3r.model.hf`), the presets (`s3r.model.presets`) and a config file's `family` field
(`ModelConfig.from_dict`).
"""

from __future__ import annotations

from s3r.model.families import deepseek_v2, gemma3, llama, qwen3, qwen3_moe
from s3r.model.families.base import Family, Reader
from s3r.model.registry import FAMILIES, config_class, family_of, readers, register

for _module in (llama, qwen3, gemma3, qwen3_moe, deepseek_v2):  # the registered families, in listing order
  register(_module.FAMILY)
