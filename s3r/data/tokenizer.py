"""Byte-level BPE tokenizer: a thin wrapper over Hugging Face ``tokenizers``.

The tokenizer is GPT-2 style: text is split by the ByteLevel pre-tokenizer
(which maps every byte to a printable symbol, so any string is encodable and
decoding is exact), merges are learned with a BPE trainer, and one special
token, ``<|endoftext|>`` (id 0), separates documents. The literal string
``<|endoftext|>`` inside a text is encoded as ordinary characters, so a
document can never fake a document boundary.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from s3r.data.errors import DataError

EOT = "<|endoftext|>"
"""The end-of-text token of a tokenizer trained here, placed after every document."""
# Bump when the tokenizer recipe changes so that cached tokenizers are retrained.
TOKENIZER_VERSION = f"s3r-bytelevel-bpe-v1/tokenizers-{tokenizers.__version__}"
MIN_VOCAB_SIZE = 257  # 256 byte symbols + <|endoftext|>


class Tokenizer:
  """Byte-level BPE tokenizer with an end-of-text token.

  Attributes:
      vocab_size: number of token ids (ids are ``0 .. vocab_size - 1``).
      eot_id: id of ``<|endoftext|>`` (or of the token ``eot`` names: a released
          model's EOS token), placed after every document.
      bos_id: id of the token ``bos`` names (a released model's BOS, when its family starts
          every text with one), placed before every document; None without one.
      released: the tokenizer of a released checkpoint (``--init-from``) rather than one trained here.
  """

  def __init__(self, hf: tokenizers.Tokenizer, eot: str = EOT, *, bos: str | None = None, released: bool = False):
    eot_id = hf.token_to_id(eot)
    if eot_id is None:
      raise DataError(f"tokenizer has no {eot} token")
    bos_id = None if bos is None else hf.token_to_id(bos)
    if bos is not None and bos_id is None:
      raise DataError(f"tokenizer has no {bos} token")
    self.eot = eot
    self.bos, self.bos_id = bos, bos_id
    self.released = released
    # Text that happens to contain "<|endoftext|>" is encoded as ordinary
    # characters; only the pipeline itself inserts the special token.
    hf.encode_special_tokens = True
    self.hf = hf
    self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
    self.eot_id: int = eot_id

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn a byte-level BPE vocabulary of at most ``vocab_size`` ids.

    The result can be smaller than ``vocab_size`` when the texts are too
    small to support that many merges; read ``.vocab_size`` afterwards.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= 2**31 - 1:
      raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (256 bytes + {EOT}), got {vocab_size}")
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=[EOT],
      show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return cls(hf)

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text`` (no end-of-text token is added)."""
    return self.hf.encode(text, add_special_tokens=False).ids

  def document(self, ids: Sequence[int]) -> list[int]:
    """A document's ids as the token stream holds them: after BOS when the tokenizer has one (a released
    model's family that starts every text with it), then the end-of-text token."""
    return [*([] if self.bos_id is None else [self.bos_id]), *ids, self.eot_id]

  def prompt(self, text: str) -> list[int]:
    """The ids of a prompt to continue, started as the documents of the token stream start: after BOS
    when the tokenizer has one; else, for a tokenizer trained here, after the end-of-text token that
    precedes every document but the first; a released tokenizer without BOS (Qwen3) adds nothing,
    as its own tokenizer does."""
    start = [self.bos_id] if self.bos_id is not None else ([] if self.released else [self.eot_id])
    return [*start, *self.encode(text)]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, encoded in parallel."""
    encodings = self.hf.encode_batch_fast(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]

  def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
    """Text of a sequence of ids (a list or a 1-D array).

    ``<|endoftext|>`` is rendered literally unless ``skip_special_tokens``.
    """
    ids = np.asarray(ids).reshape(-1).tolist()
    return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

  def save(self, path: str | os.PathLike) -> None:
    """Write the tokenizer as a Hugging Face ``tokenizer.json`` file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    self.hf.save(str(tmp))
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str | os.PathLike, eot: str = EOT) -> Tokenizer:
    """Read a tokenizer written by :meth:`save` (or a ``tokenizer.json`` whose end-of-text token is ``eot``)."""
    try:
      return cls(tokenizers.Tokenizer.from_file(os.fspath(path)), eot)
    except Exception as e:  # the Rust side raises a plain Exception
      raise DataError(f"cannot load tokenizer {path}: {e}") from None

  def __repr__(self) -> str:
    return f"Tokenizer(vocab_size={self.vocab_size}, eot_id={self.eot_id}, bos_id={self.bos_id})"
