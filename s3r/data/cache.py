"""Content-addressed caching of tokenizers and encoded token arrays.

Everything is keyed by a SHA-256 of the inputs that determine it, so a cache
entry can never be stale: a tokenizer by (recipe version, vocab size, the exact
training sample), a token array by (tokenizer key, the exact documents, the
array layout). Files are written to a temporary name and renamed, so several
processes preparing the same corpus at once cannot see a half-written file.
"""

from __future__ import annotations

import hashlib
import math
import os
import pathlib
import time
from collections.abc import Callable, Collection, Sequence

import numpy as np

from s3r.data.tokenizer import TOKENIZER_VERSION, Tokenizer

# Bump when the layout of cached token arrays changes.
TOKENS_VERSION = "eot-after-every-document-v1"
# Upper bound on the text the BPE trainer sees (the first run stays well under 2 min).
TOKENIZER_SAMPLE_CHARS = 20_000_000
# Characters of one document the BPE trainer sees (bounds its memory: a 50 MB one-line document would
# otherwise need gigabytes); longer documents contribute their first TOKENIZER_DOC_CHARS characters.
TOKENIZER_DOC_CHARS = 1_000_000
_ENCODE_CHUNK_CHARS = 4_000_000
# Documents longer than this are encoded in pieces (bounding the encoder's memory), cut before a space that
# follows a non-space character: the ByteLevel pre-tokenizer splits there too, so the ids are the same.
ENCODE_PIECE_CHARS = 1_000_000
_PROGRESS_EVERY_S = 5.0

Log = Callable[[str], None]


def digest_documents(docs: Collection[str], *extra: object) -> str:
  """Hex SHA-256 of ``extra`` and the documents (length-prefixed, so unambiguous)."""
  h = hashlib.sha256()
  for item in extra:
    h.update(repr(item).encode() + b"\0")
  for doc in docs:
    data = doc.encode("utf-8", errors="surrogatepass")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)
  return h.hexdigest()


def tokenizer_sample(
  docs: Collection[str], max_chars: int = TOKENIZER_SAMPLE_CHARS, doc_chars: int = TOKENIZER_DOC_CHARS
) -> tuple[list[str], int]:
  """A deterministic sample of documents of about ``max_chars`` characters.

  Returns ``(sample, stride)``: every ``stride``-th document, starting with the
  first, so the sample spreads over the whole corpus rather than its start,
  each cut to its first ``doc_chars`` characters (bounding the trainer's memory).
  ``stride`` is 1 (all documents) when they total at most ``max_chars``.
  """
  total = sum(min(len(d), doc_chars) for d in docs)
  stride = max(1, math.ceil(total / max_chars))
  return [d[:doc_chars] for i, d in enumerate(docs) if i % stride == 0], stride  # one pass: docs may be a stream


def dtype_for_vocab(vocab_size: int) -> np.dtype:
  """``uint16`` when every id fits in it, else ``int32``."""
  return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def save_atomic(path: pathlib.Path, write: Callable[[pathlib.Path], None]) -> None:
  """Call ``write(tmp)`` and rename ``tmp`` to ``path`` (creating directories)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)


def cached_tokenizer(
  train_docs: Collection[str], vocab_size: int, cache_dir: pathlib.Path, log: Log
) -> tuple[Tokenizer, dict]:
  """Load the tokenizer for these training documents from the cache, or train it.

  Returns the tokenizer and a JSON-serialisable description of it (path, key,
  whether it was cached, and the training sample used).
  """
  sample, stride = tokenizer_sample(train_docs)
  sample_chars = sum(len(d) for d in sample)
  key = digest_documents(sample, TOKENIZER_VERSION, vocab_size)
  path = cache_dir / "tokenizers" / f"bpe-{vocab_size}-{key[:20]}.json"
  info = {
    "path": str(path),
    "cache_key": key,
    "version": TOKENIZER_VERSION,
    "sample_docs": len(sample),
    "sample_chars": sample_chars,
    "sample_stride": stride,
    "sample": (
      "all training documents"
      if stride == 1
      else f"every {stride}th training document ({sample_chars / 1e6:.1f}M chars)"
    ),
  }
  if path.is_file():
    tok = Tokenizer.load(path)
    log(f"tokenizer: cached {path} (vocab {tok.vocab_size})")
    return tok, {**info, "cached": True}
  log(
    f"tokenizer: training byte-level BPE, vocab {vocab_size}, on {info['sample']}: "
    f"{len(sample)} docs, {sample_chars / 1e6:.1f}M chars ..."
  )
  t0 = time.perf_counter()
  tok = Tokenizer.train(sample, vocab_size)
  tok.save(path)
  log(f"tokenizer: trained in {time.perf_counter() - t0:.1f}s (vocab {tok.vocab_size}), saved {path}")
  return tok, {**info, "cached": False}


def given_tokenizer_info(tok: Tokenizer) -> dict:
  """The description of a tokenizer that was given rather than trained (keyed by its JSON and end-of-text token)."""
  starts = "" if tok.bos is None else f"\0bos={tok.bos}"  # documents after BOS encode differently
  key = hashlib.sha256(f"{tok.hf.to_str()}\0{tok.eot}{starts}".encode()).hexdigest()
  return {"cache_key": key, "version": "given", "eot": tok.eot, "bos": tok.bos, "cached": True}


def cached_tokens(
  split: str, docs: Collection[str], tok: Tokenizer, tok_key: str, cache_dir: pathlib.Path, log: Log
) -> tuple[np.ndarray, dict]:
  """Encode ``docs`` (EOT after each) or load the identical encoding from the cache. Documents that are not a list
  (``s3r.data.stream.SplitDocuments``: read from disk on every pass) are encoded to the cache file a chunk at a
  time, and their tokens are memory-mapped from it, so neither is held in memory whole."""
  dtype = dtype_for_vocab(tok.vocab_size)
  streamed = not isinstance(docs, list)
  key = digest_documents(docs, TOKENS_VERSION, tok_key, dtype.str)
  path = cache_dir / "tokens" / f"{split}-{key[:20]}.npy"
  info = {"path": str(path), "cache_key": key}
  if path.is_file():
    try:
      tokens = np.load(path, mmap_mode="r" if streamed else None)
      if tokens.ndim == 1 and tokens.dtype == dtype:
        log(f"tokens: cached {split}: {len(tokens):,} tokens ({path})")
        return tokens, {**info, "cached": True}
    except (OSError, ValueError):
      pass
    log(f"tokens: ignoring unreadable cache file {path}")
  if streamed:
    encode_to_file(docs, tok, dtype, split, log, path)
    return np.load(path, mmap_mode="r"), {**info, "cached": False}
  tokens = encode_documents(docs, tok, dtype, split, log)
  save_atomic(path, lambda tmp: np.save(tmp, tokens))
  return tokens, {**info, "cached": False}


def encode_documents(docs: Collection[str], tok: Tokenizer, dtype: np.dtype, label: str, log: Log) -> np.ndarray:
  """One 1-D array: each document's ids followed by ``tok.eot_id`` (after ``tok.bos_id`` when it has one).

  Documents are encoded in parallel batches of about 4M characters, with a
  progress line every few seconds for large corpora.
  """
  t0 = time.perf_counter()
  parts = list(_encoded_parts(docs, tok, dtype, label, log))
  tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
  _log_encoded(docs, label, len(tokens), t0, log)
  return tokens


def encode_to_file(docs: Collection[str], tok: Tokenizer, dtype: np.dtype, label: str, log: Log, path: pathlib.Path):
  """`encode_documents` written to the .npy file `path` (atomically) a chunk at a time, never all in memory."""
  t0, n = time.perf_counter(), 0
  raw = path.with_name(f".{path.stem}.{os.getpid()}.raw")
  path.parent.mkdir(parents=True, exist_ok=True)
  try:
    with open(raw, "wb") as f:
      for part in _encoded_parts(docs, tok, dtype, label, log):
        part.tofile(f)
        n += len(part)

    def write(tmp: pathlib.Path) -> None:
      out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n,))
      if n:
        src = np.memmap(raw, dtype=dtype, mode="r", shape=(n,))
        for start in range(0, n, 1 << 24):
          out[start : start + (1 << 24)] = src[start : start + (1 << 24)]
        del src
      out.flush()
      del out

    save_atomic(path, write)
  finally:
    raw.unlink(missing_ok=True)
  _log_encoded(docs, label, n, t0, log)


def _encoded_parts(docs: Collection[str], tok: Tokenizer, dtype: np.dtype, label: str, log: Log):
  """The token arrays of chunks of about _ENCODE_CHUNK_CHARS characters of `docs`, in order, with a progress line
  every few seconds."""
  total_chars = getattr(docs, "n_chars", None) or sum(len(d) for d in docs)
  t0 = last = time.perf_counter()
  done_chars = 0
  for chunk in _chunks(docs, _ENCODE_CHUNK_CHARS):
    yield _encode_chunk(chunk, tok, dtype)
    done_chars += sum(len(d) for d in chunk)
    now = time.perf_counter()
    if now - last >= _PROGRESS_EVERY_S:
      last = now
      log(
        f"tokens: encoding {label} {100 * done_chars / max(total_chars, 1):.0f}% "
        f"({done_chars / 1e6:.1f}/{total_chars / 1e6:.1f}M chars, "
        f"{done_chars / 1e6 / (now - t0):.1f}M chars/s)"
      )


def _log_encoded(docs: Collection[str], label: str, n_tokens: int, t0: float, log: Log) -> None:
  chars = getattr(docs, "n_chars", None) or sum(len(d) for d in docs)
  log(
    f"tokens: encoded {label}: {len(docs):,} docs, {chars / 1e6:.1f}M chars -> "
    f"{n_tokens:,} tokens in {time.perf_counter() - t0:.1f}s"
  )


def _chunks(docs: Collection[str], max_chars: int):
  chunk, size = [], 0
  for doc in docs:
    chunk.append(doc)
    size += len(doc)
    if size >= max_chars:
      yield chunk
      chunk, size = [], 0
  if chunk:
    yield chunk


def split_long_document(doc: str, size: int = ENCODE_PIECE_CHARS) -> list[str]:
  """``doc`` in pieces of at most ``size`` characters, each (but the last) ending just before a
  space preceded by a non-space character when there is one in the piece's second half."""
  pieces, start = [], 0
  while len(doc) - start > size:
    end = start + size
    cut = doc.rfind(" ", start + size // 2, end)
    while cut > start and doc[cut - 1].isspace():
      cut = doc.rfind(" ", start + size // 2, cut)
    end = cut if cut > start else end
    pieces.append(doc[start:end])
    start = end
  pieces.append(doc[start:])
  return pieces


def encode_long(tok: Tokenizer, docs: Sequence[str]) -> list[list[int]]:
  """``tok.encode_batch(docs)``, with documents longer than ENCODE_PIECE_CHARS encoded piece by piece."""
  if all(len(d) <= ENCODE_PIECE_CHARS for d in docs):
    return tok.encode_batch(docs)
  out = []
  for doc in docs:
    if len(doc) <= ENCODE_PIECE_CHARS:
      out.extend(tok.encode_batch([doc]))
    else:
      out.append([i for piece in split_long_document(doc) for i in tok.encode(piece)])
  return out


def _encode_chunk(chunk: Sequence[str], tok: Tokenizer, dtype: np.dtype) -> np.ndarray:
  ids = encode_long(tok, chunk)
  starts = 0 if tok.bos_id is None else 1  # BOS before each document (`Tokenizer.document`)
  out = np.empty(sum(len(x) for x in ids) + (1 + starts) * len(ids), dtype)
  pos = 0
  for x in ids:
    if starts:
      out[pos] = tok.bos_id
      pos += 1
    out[pos : pos + len(x)] = x
    pos += len(x)
    out[pos] = tok.eot_id
    pos += 1
  return out
