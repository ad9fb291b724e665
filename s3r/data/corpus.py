"""``prepare()``: from a corpus on disk to a tokenizer and token arrays.

Which corpus (``data`` argument):

The data root is ``$S3R_DATA`` if set, else ``../shared/data`` beside the
repository if present (see :func:`s3r.data.sources.locate_data_root`).

* ``None`` or ``"enwiki"`` -- ``<data root>/enwiki``: every shard but the last
  is training data, the last shard (shard 9) is validation. If there is no
  data root with ``enwiki/`` (and ``data`` is ``None``), the fallback is the
  ``.py`` files of the running Python's standard library, which every Python
  has (also selectable as ``"python-stdlib"``).
* anything else -- a file, glob, or directory (see :mod:`s3r.data.sources`); a
  relative path that does not exist is also looked up under the data root, so
  ``"shakespeare"`` works. Documents (not tokens) are split into train and
  validation by a hash of their text, so no document (nor any exact duplicate
  of it) is on both sides.

Whenever the data root has ``c4/c4-sample-a.json.gz`` and it is not part of
the training data, it is encoded too, as the out-of-domain validation set
``"c4"``. The tokenizer is trained on training documents only.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
from collections.abc import Callable, Collection, Sequence

import numpy as np

from s3r.data import sources, stream
from s3r.data.cache import cached_tokenizer, cached_tokens, given_tokenizer_info
from s3r.data.errors import DataError
from s3r.data.tokenizer import MIN_VOCAB_SIZE, Tokenizer

STDLIB_NAME = "python-stdlib"
ENWIKI_NAME = "enwiki"
C4_VAL_FILE = ("c4", "c4-sample-a.json.gz")
_MAX_LISTED_FILES = 32


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """A tokenized corpus, as returned by :func:`prepare`.

  Attributes:
      name: ``"enwiki"``, ``"python-stdlib"``, or the path the user gave.
      tokenizer: the tokenizer trained on the training documents.
      train_tokens: 1-D ``uint16`` (``int32`` if the vocabulary exceeds 65536)
          array of all training documents, each followed by ``eot_id``.
      val_tokens: ``{"val": ...}`` (in-domain held-out documents) and, when
          available, ``"c4"`` (out-of-domain web text); same layout.
      info: JSON-serialisable description: name, files, split, document,
          character and token counts, vocabulary, and cache keys/paths.
  """

  name: str
  tokenizer: Tokenizer
  train_tokens: np.ndarray
  val_tokens: dict[str, np.ndarray]
  info: dict


@dataclasses.dataclass
class _Source:
  """Documents chosen for each split, before tokenization."""

  name: str
  split: str
  train: Collection[str]  # a list, or for a corpus named by a path, stream.SplitDocuments (read on every pass)
  val: dict[str, Collection[str]]
  files: dict[str, list[pathlib.Path]]
  text_column: str | None = None  # the column (JSON field) the texts came from; None: "text"
  n_docs: int | None = None  # documents in the files (of a corpus named by a path)


def prepare(
  data: str | None,
  *,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike = ".cache/s3r",
  val_fraction: float = 0.05,
  max_train_docs: int | None = None,
  tokenizer: Tokenizer | None = None,
  text_column: str | None = None,
  log: Callable[[str], None] = print,
) -> Corpus:
  """Read a corpus, train (or reuse) its tokenizer, and encode every split.

  See the module docstring for how ``data`` is interpreted. ``max_train_docs``
  keeps only the first that many training documents (for quick runs); the
  validation sets are unaffected. ``tokenizer`` (e.g. a released model's):
  encode with it instead of training one (``vocab_size`` is then unused). The
  ``text_column``: the column (JSON field) holding the text of Parquet, Arrow and
  JSON-lines files (``text`` when None). The
  tokenizer and every token array are cached in ``cache_dir`` under a hash of
  their inputs, so a second call on the same corpus only reads and hashes the
  text. Raises :class:`DataError` for problems with the data and
  ``ValueError`` for invalid arguments.
  """
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
  if max_train_docs is not None and max_train_docs < 1:
    raise ValueError(f"max_train_docs must be >= 1 or None, got {max_train_docs}")
  if vocab_size < MIN_VOCAB_SIZE:
    raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (256 bytes + EOT), got {vocab_size}")
  data = None if data is None else os.fspath(data)
  cache = pathlib.Path(cache_dir)
  root, how = sources.locate_data_root()
  src = _select_source(data, root, how, val_fraction, max_train_docs, log, text_column)
  if tokenizer is None:
    tok, tok_info = cached_tokenizer(src.train, vocab_size, cache, log)
  else:
    tok, tok_info = tokenizer, given_tokenizer_info(tokenizer)
  splits = {"train": src.train, **src.val}
  arrays, cache_info = {}, {}
  for split, docs in splits.items():
    arrays[split], cache_info[split] = cached_tokens(split, docs, tok, tok_info["cache_key"], cache, log)
  info = _corpus_info(
    src,
    root,
    splits,
    arrays,
    tok,
    tok_info=tok_info,
    cache_info=cache_info,
    requested_vocab_size=vocab_size,
    val_fraction=val_fraction,
    max_train_docs=max_train_docs,
  )
  log(
    f"data: {src.name}: "
    + ", ".join(f"{k} {info['n_docs'][k]:,} docs / {info['n_tokens'][k]:,} tokens" for k in splits)
  )
  train = arrays.pop("train")
  return Corpus(name=src.name, tokenizer=tok, train_tokens=train, val_tokens=arrays, info=info)


def _corpus_info(
  src, root, splits, arrays, tok, *, tok_info, cache_info, requested_vocab_size, val_fraction, max_train_docs
) -> dict:
  """The provenance a run records for its corpus: sources, sizes, tokenizer and caches."""
  return {
    "name": src.name,
    "split": src.split,
    "data_root": str(root) if root else None,
    "n_files": {k: len(v) for k, v in src.files.items()},
    "files": {k: [str(f) for f in v[:_MAX_LISTED_FILES]] for k, v in src.files.items()},
    "n_docs": {k: len(v) for k, v in splits.items()},
    "n_chars": {k: getattr(v, "n_chars", None) or sum(len(d) for d in v) for k, v in splits.items()},
    "n_tokens": {k: int(len(v)) for k, v in arrays.items()},
    "vocab_size": tok.vocab_size,
    "requested_vocab_size": requested_vocab_size,
    "eot_id": tok.eot_id,
    "dtype": arrays["train"].dtype.name,
    "val_fraction": val_fraction,
    "max_train_docs": max_train_docs,
    "text_column": src.text_column,
    "tokenizer": tok_info,
    "token_cache": cache_info,
  }


def select_documents(
  data: str | None,
  *,
  val_fraction: float = 0.05,
  max_train_docs: int | None = None,
  text_column: str | None = None,
  log: Callable[[str], None] = print,
) -> _Source:
  """The documents of each split of ``data`` exactly as :func:`prepare` chooses them
  (``.train``, ``.val``), without tokenizing; e.g. to compare a corpus with a run's training data."""
  root, how = sources.locate_data_root()
  data = None if data is None else os.fspath(data)
  return _select_source(data, root, how, val_fraction, max_train_docs, log, text_column)


def _select_source(
  data: str | None,
  root: pathlib.Path | None,
  how: str,
  val_fraction: float,
  max_train_docs: int | None,
  log,
  text_column: str | None = None,
) -> _Source:
  """Decide which documents make up each split (see module docstring)."""
  enwiki = root / ENWIKI_NAME if root else None
  if data is None or data == ENWIKI_NAME:
    if enwiki is not None and enwiki.is_dir():
      src = _enwiki_source(enwiki, how, max_train_docs, log)
    elif data == ENWIKI_NAME:
      raise DataError(
        f"--data {ENWIKI_NAME} needs {ENWIKI_NAME}/ in the data root "
        f"({root or how}); set ${sources.DATA_DIR_ENV} to the folder that holds it, "
        f"or use --data {STDLIB_NAME} (needs no data)"
      )
    else:
      why = how if root is None else f"data root {root} ({how}) has no {ENWIKI_NAME}/"
      src = _stdlib_source(val_fraction, max_train_docs)
      log(
        f"data: {why}; using the Python standard library as the corpus: "
        f"{len(src.files['train'])} .py files under {sources.stdlib_root()}"
      )
  elif data == STDLIB_NAME:
    src = _stdlib_source(val_fraction, max_train_docs)
    log(f"data: {STDLIB_NAME}: .py files under {sources.stdlib_root()}")
  else:
    path = resolve_data_path(data, root, how)
    files = sources.resolve_files(path)
    src = _streamed_source(data, files, path, text_column, val_fraction, max_train_docs)
    log(
      f"data: {data}: {len(files)} file(s), {src.n_docs:,} documents, split by "
      f"document hash into {len(src.train):,} train / {len(src.val['val']):,} val"
    )
  _add_c4_validation(src, root, log)
  return src


def resolve_data_path(data: str, root: pathlib.Path | None = None, how: str | None = None) -> str:
  """``data`` itself if it exists (or is a glob), else ``<data root>/data`` ("shakespeare");
  a :class:`DataError` that says where names are looked up when neither exists."""
  if root is None and how is None:
    root, how = sources.locate_data_root()
  p = pathlib.Path(os.path.expanduser(data))
  if p.exists() or sources.has_glob(data):
    return data
  if root is not None and not p.is_absolute() and (root / p).exists():
    return str(root / p)
  if p.is_absolute() or os.sep in data.strip(os.sep):
    raise DataError(f"data path does not exist: {data}")
  where = f"the data root {root} ({how}) has no {data}" if root is not None else f"there is no data root: {how}"
  raise DataError(
    f"--data {data}: no such file or folder here, and {where}; names such as {ENWIKI_NAME}, "
    f"shakespeare and c4 are folders of the data root (set ${sources.DATA_DIR_ENV}), "
    f"--data {STDLIB_NAME} needs no data"
  )


def _enwiki_source(enwiki: pathlib.Path, how: str, max_train_docs: int | None, log) -> _Source:
  shards = sources.resolve_files(enwiki)
  if len(shards) < 2:
    raise DataError(f"{enwiki} needs at least 2 shards (train + validation), found {len(shards)}")
  train_files, val_files = shards[:-1], shards[-1:]
  train = list(itertools.islice(sources.read_files(train_files, enwiki), max_train_docs))
  val = list(sources.read_files(val_files, val_files[0]))
  log(
    f"data: {ENWIKI_NAME} from {enwiki} (data root: {how}): shards 0-{len(train_files) - 1} train, "
    f"shard {len(train_files)} validation"
  )
  split = f"shards {shards[0].name}..{train_files[-1].name} train, {val_files[0].name} val"
  return _Source(ENWIKI_NAME, split, train, {"val": val}, {"train": train_files, "val": val_files})


def _stdlib_source(val_fraction: float, max_train_docs: int | None) -> _Source:
  files = sources.stdlib_python_files()
  docs = list(sources.read_files(files, sources.stdlib_root()))
  return _hash_split_source(STDLIB_NAME, files, docs, val_fraction, max_train_docs)


def _hash_split_source(
  name: str, files: list[pathlib.Path], docs: list[str], val_fraction: float, max_train_docs: int | None
) -> _Source:
  train_idx, val_idx = split_documents(docs, val_fraction, label=name)
  train = [docs[i] for i in train_idx][:max_train_docs]
  split = f"document-text hash, val_fraction={val_fraction}"
  # Each file may hold documents of both splits, so both list all files.
  return _Source(name, split, train, {"val": [docs[i] for i in val_idx]}, {"train": files, "val": files})


def _streamed_source(
  name: str, files: list[pathlib.Path], label: str, text_column: str | None, val_fraction: float, max_train_docs
) -> _Source:
  """The hash split of a corpus on disk as `stream.SplitDocuments`: one pass reads every document's hash and length,
  and each split reads its documents from the files on every pass (never all in memory)."""
  scores, lengths = stream.scan(files, label, text_column)
  held_out = _held_out(scores, len(scores), val_fraction, name)
  train = stream.SplitDocuments(files, label, text_column, ~held_out, lengths, max_train_docs)
  val = stream.SplitDocuments(files, label, text_column, held_out, lengths)
  split = f"document-text hash, val_fraction={val_fraction}"
  return _Source(name, split, train, {"val": val}, {"train": files, "val": files}, text_column, len(scores))


def split_documents(docs: Sequence[str], val_fraction: float, *, label: str = "corpus") -> tuple[list[int], list[int]]:
  """Indices of training and validation documents, chosen by a hash of each text.

  A document is held out when its hash, as a number in [0, 1), is below
  ``val_fraction``; identical texts always land on the same side. At least
  one document (group of identical texts) is held out and at least one is
  kept for training; a corpus with fewer than two distinct documents raises
  :class:`DataError`.
  """
  scores = np.asarray([stream.unit_hash(d) for d in docs], np.float64)
  held_out = _held_out(scores, len(docs), val_fraction, label)
  return np.flatnonzero(~held_out).tolist(), np.flatnonzero(held_out).tolist()


def _held_out(scores: np.ndarray, n_docs: int, val_fraction: float, label: str) -> np.ndarray:
  """Which documents `split_documents` holds out, from their hash scores."""
  distinct = len(np.unique(scores))
  if distinct < 2:
    raise DataError(
      f"{label} has {n_docs} document(s) ({distinct} distinct); "
      f"need at least 2 to split into train and validation "
      f"(a .txt file is split into documents at two or more blank lines)"
    )
  threshold = val_fraction
  if not np.any(scores < threshold):  # hold out the lowest-scoring text
    threshold = np.nextafter(scores.min(), 1.0)
  if np.all(scores < threshold):  # keep the highest-scoring text for training
    threshold = scores.max()
  return scores < threshold


def _add_c4_validation(src: _Source, root: pathlib.Path | None, log) -> None:
  """Add ``<root>/c4/c4-sample-a.json.gz`` as validation set "c4" if usable."""
  if root is None:
    return
  c4 = root.joinpath(*C4_VAL_FILE)
  if not c4.is_file():
    return
  train_files = {f.resolve() for f in src.files["train"]}
  if c4.resolve() in train_files:
    log(f"data: not using {c4} for out-of-domain validation: it is training data")
    return
  src.val["c4"] = list(sources.read_files([c4], c4))
  src.files["c4"] = [c4]
