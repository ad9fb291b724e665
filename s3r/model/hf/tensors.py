"""Where each s3r parameter lives in a Hugging Face checkpoint: `tensor_map(cfg, names)` lists one
`Entry` per leaf of the s3r params tree (in the per-layer layout, `("blocks", layer, ...)`): the Hub
tensor(s) it is made of and the `Layout` between the two (s3r.model.hf.layouts). The embedding, final
norm and logits head are common to every family; each family maps its blocks (s3r.model.families).
"""

from __future__ import annotations

from s3r.model import families
from s3r.model.config import ModelConfig
from s3r.model.hf.layouts import Copy, Entry, Linear, norm

TEXT_PREFIXES = (  # (decoder prefix, logits head) of each spelling of the checkpoint names
  ("model.", "lm_head.weight"),
  ("language_model.model.", "language_model.lm_head.weight"),  # Gemma3ForConditionalGeneration as published
  ("model.language_model.", "lm_head.weight"),  # ... as transformers' module tree names it
)


def text_prefix(names: set[str]) -> tuple[str, str]:
  """(decoder prefix, logits head name) of the checkpoint whose names are `names`."""
  for prefix, head in TEXT_PREFIXES:
    if f"{prefix}embed_tokens.weight" in names:
      return prefix, head
  return TEXT_PREFIXES[0]


def tensor_map(cfg: ModelConfig, names: set[str]) -> list[Entry]:
  """The Entry of every s3r parameter of `cfg`, named as in a checkpoint holding `names` (which
  decides the decoder prefix and whether the experts are fused)."""
  prefix, head = text_prefix(names)
  fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
  out = [Entry(("embed",), (f"{prefix}embed_tokens.weight",), Copy()), norm(("final_norm",), f"{prefix}norm")]
  if not cfg.tie_embeddings:
    out.append(Entry(("out",), (head,), Linear()))
  block_tensors = families.family_of(cfg).block_tensors
  for layer in range(cfg.n_layers):
    out += block_tensors(cfg, layer, f"{prefix}layers.{layer}", fused)
  return out
