"""The tokenizer that comes with a Hugging Face checkpoint: `tokenizer.json` through the `tokenizers`
package, the BOS / EOS tokens named in `tokenizer_config.json`, and whether a text starts with BOS.

The family's convention (docs/models.md, "Tokenization"): a text starts with BOS when
`tokenizer_config.json` says `add_bos_token: true` (Gemma 3, DeepSeek-V2), or, without that field,
when the post-processor of `tokenizer.json` adds it (Llama 3); never without a BOS token (Qwen3).
Training documents are [BOS] text EOS, prompts [BOS] text, in fine-tuning, evaluation and generation
alike.
"""

from __future__ import annotations

import dataclasses
import pathlib

import tokenizers

from s3r.model.hf.checkpoint import read_json
from s3r.model.hf.errors import HFError


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFTokenizer:
  """A checkpoint's tokenizer: `hf` (a `tokenizers.Tokenizer`), `bos_id` and `eos_id` (None when the
  checkpoint names none)."""

  hf: tokenizers.Tokenizer
  bos_id: int | None
  eos_id: int | None
  add_bos: bool = False  # every text starts with BOS (see the module doc)

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`; with add_special_tokens, those the tokenizer's post-processor adds (e.g. BOS)."""
    return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

  def prompt(self, text: str) -> list[int]:
    """The ids of a prompt to continue: BOS first when the family starts a text with it, then `text`."""
    return [
      *([self.bos_id] if self.add_bos and self.bos_id is not None else []),
      *self.encode(text, add_special_tokens=False),
    ]

  def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def _token(config: dict, field: str, tok: tokenizers.Tokenizer, source: pathlib.Path) -> int | None:
  value = config.get(field)
  if isinstance(value, dict):  # the AddedToken spelling: {"content": "<s>", ...}
    value = value.get("content")
  if value is None:
    return None
  if not isinstance(value, str):
    raise HFError(f"{source}: {field}={value!r} is not a token")
  token_id = tok.token_to_id(value)
  if token_id is None:
    raise HFError(f"{source}: {field}={value!r} is not in the vocabulary of tokenizer.json")
  return token_id


def load_hf_tokenizer(path: str | pathlib.Path) -> HFTokenizer:
  """The tokenizer of the checkpoint folder `path` (HFError naming the file when it is missing or unreadable)."""
  folder = pathlib.Path(path)
  file = folder / "tokenizer.json"
  if not file.is_file():
    raise HFError(f"{file}: no such file (the checkpoint has no tokenizer)")
  try:
    tok = tokenizers.Tokenizer.from_file(str(file))
  except Exception as e:  # tokenizers raises its own Exception subclass for malformed files
    raise HFError(f"{file}: not a tokenizers file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  config_file = folder / "tokenizer_config.json"
  config = read_json(config_file) if config_file.exists() else {}
  bos_id = _token(config, "bos_token", tok, config_file)
  eos_id = _token(config, "eos_token", tok, config_file)
  return HFTokenizer(hf=tok, bos_id=bos_id, eos_id=eos_id, add_bos=_adds_bos(config, tok, bos_id, config_file))


def _adds_bos(config: dict, tok: tokenizers.Tokenizer, bos_id: int | None, source: pathlib.Path) -> bool:
  """Whether a text starts with BOS: `add_bos_token` when the config sets it, else what the post-processor does."""
  if bos_id is None:
    return False
  given = config.get("add_bos_token")
  if given is not None:
    if not isinstance(given, bool):
      raise HFError(f"{source}: add_bos_token={given!r} is not true or false")
    return given
  probe = "a"
  return (
    tok.encode(probe, add_special_tokens=True).ids[:1]
    == [bos_id]
    != tok.encode(probe, add_special_tokens=False).ids[:1]
  )
