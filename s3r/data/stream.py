"""The splits of a corpus on disk as documents read again from its files on every pass, never held in memory.

A corpus named by a path (files, a glob, a folder; every format of :mod:`s3r.data.sources`) is split into
train and validation by a hash of each document's text (:func:`s3r.data.corpus.split_documents`). Instead
of a list of its documents, each split is a :class:`SplitDocuments`: one pass over the files computes every
document's hash and length (about 18 bytes a document, with the split masks), and iterating a split reads
the files again and yields its documents. Tokenizer training reads a bounded sample, and the token arrays
are written to the cache a chunk at a time and memory-mapped (:func:`s3r.data.cache.cached_tokens`), so
the corpus's size is bounded by the disk rather than by memory. Each pass streams as its format allows:
Parquet and Arrow files a record batch at a time, JSON lines a line at a time, a ``.txt`` file whole.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Collection, Iterator

import numpy as np

from s3r.data import sources
from s3r.data.errors import DataError


def unit_hash(text: str) -> float:
  """A document's hash as a number in [0, 1) (what decides its split)."""
  digest = hashlib.blake2b(text.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


class SplitDocuments(Collection[str]):
  """The documents of one split, in corpus order: those whose entry of `member` is true, the first `limit`.

  `len()` is their number and `n_chars` their characters (both known without reading them again);
  each iteration reads the files anew."""

  def __init__(self, files: list[pathlib.Path], label: str, text_column: str | None, member, lengths, limit=None):
    self.files, self.label, self.text_column = files, label, text_column
    self.member = np.asarray(member, bool)
    chosen = np.flatnonzero(self.member)[:limit]
    self.n_docs = len(chosen)
    self.n_chars = int(np.asarray(lengths, np.int64)[chosen].sum())

  def __len__(self) -> int:
    return self.n_docs

  def __contains__(self, text: object) -> bool:
    return any(doc == text for doc in self)

  def __iter__(self) -> Iterator[str]:
    if self.n_docs == 0:
      return
    n = 0
    docs = sources.read_files(self.files, self.label, self.text_column)
    for i, doc in enumerate(docs):
      if i >= len(self.member):
        break
      if self.member[i]:
        yield doc
        n += 1
        if n == self.n_docs:
          return
    raise DataError(f"corpus {self.label} changed while it was read (fewer documents than on the first pass)")


def scan(files: list[pathlib.Path], label: str, text_column: str | None) -> tuple[np.ndarray, np.ndarray]:
  """(hash score, length in characters) of every document of `files`, in one pass."""
  scores, lengths = [], []
  for doc in sources.read_files(files, label, text_column):
    scores.append(unit_hash(doc))
    lengths.append(len(doc))
  return np.asarray(scores, np.float64), np.asarray(lengths, np.int64)
