"""Finding corpora on disk and reading them as a stream of documents.

Supported file formats (chosen by file name):

* ``.txt`` -- plain UTF-8 text. A file is split into documents on runs of two
  or more consecutive blank lines (lines holding only spaces/tabs count as
  blank); a single blank line (a paragraph break) stays inside a document.
* ``.jsonl``, ``.jsonl.gz``, ``.json.gz`` -- one JSON object per line (the C4
  layout) with a ``"text"`` field. A record with ``"prefix"`` and
  ``"gold_completion"`` but no ``"text"`` counts as ``prefix + gold_completion``.
  Blank lines are skipped.
* ``.py`` -- each file is one document (decoded as UTF-8, undecodable bytes
  replaced); used for the Python-standard-library fallback corpus.
* ``.parquet``, ``.arrow`` and folders written by Hugging Face ``datasets``'
  ``save_to_disk`` -- one document per row, from its ``text`` column (or the
  column ``text_column`` names; it also names the field of JSON records), read a
  record batch at a time with pyarrow (:mod:`s3r.data.arrow`).

Whitespace-only documents are skipped everywhere.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import pathlib
import re
import sysconfig
import zlib
from collections.abc import Iterator

from s3r.data import arrow
from s3r.data.errors import DataError

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".json.gz", ".py", arrow.PARQUET_SUFFIX, arrow.ARROW_SUFFIX)
DATA_DIR_ENV = "S3R_DATA"

# Two or more consecutive blank lines separate documents in a .txt file.
_TXT_SEPARATOR = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
_GLOB_CHARS = re.compile(r"[*?\[]")
# Parts of the standard library that are not ordinary hand-written modules.
_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}


def is_supported(path: str | os.PathLike) -> bool:
  """True if ``path``'s name ends with one of :data:`SUPPORTED_SUFFIXES`."""
  return os.fspath(path).lower().endswith(SUPPORTED_SUFFIXES)


def resolve_files(path: str | os.PathLike) -> list[pathlib.Path]:
  """Expand a file, glob, or directory into a sorted list of supported files.

  A directory is searched recursively (hidden entries and ``__pycache__``
  skipped); files are sorted by their path relative to it. A folder written by
  ``datasets``' ``save_to_disk`` gives its Arrow files in its own order. Raises
  :class:`DataError` if the path does not exist, matches no supported file,
  or names a single file of an unsupported type.
  """
  text = os.path.expanduser(os.fspath(path))
  p = pathlib.Path(text)
  if p.is_file():
    if not is_supported(p):
      raise DataError(f"unsupported file type: {text} (supported: {', '.join(SUPPORTED_SUFFIXES)})")
    return [p]
  if arrow.is_dataset_folder(p):
    return arrow.dataset_files(p)
  if p.is_dir():
    files = sorted(f for f in p.rglob("*") if f.is_file() and is_supported(f) and not _hidden(f.relative_to(p)))
    if not files:
      raise DataError(f"directory {text} contains no supported files ({', '.join(SUPPORTED_SUFFIXES)})")
    return files
  if has_glob(text):
    matches = sorted(glob.glob(text, recursive=True))
    files = [pathlib.Path(m) for m in matches if os.path.isfile(m) and is_supported(m)]
    if not files:
      raise DataError(
        f"glob {text} matches no supported files "
        f"({len(matches)} matches of any kind; supported: "
        f"{', '.join(SUPPORTED_SUFFIXES)})"
      )
    return files
  raise DataError(f"data path does not exist: {text}")


def has_glob(text: str) -> bool:
  """True if ``text`` contains glob wildcards (``*``, ``?``, ``[``)."""
  return bool(_GLOB_CHARS.search(text))


def _hidden(rel: pathlib.Path) -> bool:
  return any(part.startswith(".") or part == "__pycache__" for part in rel.parts)


def read_documents(path: str | os.PathLike, text_column: str | None = None) -> Iterator[str]:
  """Yield the non-empty documents of a file, glob, or directory, in order.

  Formats (by name): ``.txt`` (split into documents at two or more
  consecutive blank lines), ``.jsonl`` / ``.jsonl.gz`` / ``.json.gz`` (one
  JSON object per line; its ``"text"``, or ``"prefix" + "gold_completion"``),
  and ``.py`` (one document per file). A directory is read recursively,
  files sorted by path; see the module docstring for details.

  The path is checked eagerly (a missing path raises :class:`DataError` at
  the call); file contents are read lazily. Problems found while reading
  (bad JSON, a record without ``"text"``, bad UTF-8 or gzip, or a corpus
  with no non-empty document at all) raise :class:`DataError` naming the
  file and, for JSON, the line number. ``text_column``: the column (the JSON
  field) that holds the text of Parquet, Arrow and JSON-lines files, ``text``
  when None.
  """
  files = resolve_files(path)
  return read_files(files, os.fspath(path), text_column)


def read_files(files: list[pathlib.Path], label: str | pathlib.Path, text_column: str | None = None) -> Iterator[str]:
  """Yield the non-empty documents of ``files`` in order.

  Raises :class:`DataError` (naming ``label``) after the last file if there
  was no document at all.
  """
  n = 0
  for f in files:
    for doc in read_file_documents(f, text_column):
      n += 1
      yield doc
  if n == 0:
    raise DataError(f"corpus {label} is empty: no non-empty document in {len(files)} file(s)")


def read_file_documents(path: pathlib.Path, text_column: str | None = None) -> Iterator[str]:
  """Yield the non-empty documents of one supported file (see module doc)."""
  name = path.name.lower()
  try:
    if name.endswith((arrow.PARQUET_SUFFIX, arrow.ARROW_SUFFIX)):
      yield from arrow.read_columnar_documents(path, text_column)
    elif name.endswith(".py"):
      yield from _nonempty([path.read_bytes().decode("utf-8", errors="replace")])
    elif name.endswith(".txt"):
      yield from _nonempty(split_text_documents(_read_utf8(path)))
    elif name.endswith(".gz"):
      with gzip.open(path, "rb") as fh:
        yield from _nonempty(_jsonl_texts(fh, path, text_column))
    else:
      with open(path, "rb") as fh:
        yield from _nonempty(_jsonl_texts(fh, path, text_column))
  except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
    raise DataError(f"cannot read {path}: {e}") from None


def _read_utf8(path: pathlib.Path) -> str:
  data = path.read_bytes()
  try:
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
  except UnicodeDecodeError as e:
    raise DataError(f"{path} is not valid UTF-8 (byte {e.start})") from None


def split_text_documents(text: str) -> list[str]:
  """Split plain text into documents on two or more consecutive blank lines.

  Leading blank lines and trailing whitespace of each document are removed.
  """
  return [_LEADING_BLANK_LINES.sub("", block).rstrip() for block in _TXT_SEPARATOR.split(text)]


def _nonempty(docs) -> Iterator[str]:
  for doc in docs:
    if doc and not doc.isspace():
      yield doc


def _jsonl_texts(lines, path: pathlib.Path, text_column: str | None = None) -> Iterator[str]:
  """Yield the text of each JSON line (bytes lines), with file:line errors."""
  for lineno, raw in enumerate(lines, start=1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start})") from None
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    yield _record_text(record, path, lineno, text_column)


def _record_text(record, path: pathlib.Path, lineno: int, text_column: str | None = None) -> str:
  field = text_column or "text"
  if not isinstance(record, dict):
    raise DataError(f'{path}:{lineno}: expected a JSON object with a "{field}" field, got {type(record).__name__}')
  if field in record:
    text = record[field]
  elif text_column is None and "prefix" in record and "gold_completion" in record:
    prefix, completion = record["prefix"], record["gold_completion"]
    if isinstance(prefix, str) and isinstance(completion, str):
      return prefix + completion
    raise DataError(f'{path}:{lineno}: "prefix" and "gold_completion" must be strings')
  else:
    keys = ", ".join(sorted(map(str, record))) or "none"
    raise DataError(f'{path}:{lineno}: JSON record has no "{field}" field (keys: {keys})')
  if not isinstance(text, str):
    raise DataError(f'{path}:{lineno}: "{field}" must be a string, got {type(text).__name__}')
  return text


def repository_data_root() -> pathlib.Path | None:
  """``shared/data`` beside the repository (``<repository root>/../shared/data``) when this
  package runs from a source checkout (``pyproject.toml`` two levels above ``s3r/data``);
  None for an installed package, which uses ``$S3R_DATA`` or an explicit ``--data``."""
  root = pathlib.Path(__file__).resolve().parents[2]
  return root.parent / "shared" / "data" if (root / "pyproject.toml").is_file() else None


def locate_data_root() -> tuple[pathlib.Path | None, str]:
  """The data root (the folder that holds ``enwiki/``, ``c4/``, ``shakespeare``)
  and how it was found, in this order:

  1. ``$S3R_DATA`` if set (a :class:`DataError` if it is not a directory);
  2. :func:`repository_data_root` if it exists;
  3. none (``(None, why)``): named corpora are unavailable and the default
     corpus falls back to the Python standard library.

  (An explicit ``--data`` path is used as given and needs no data root.)
  """
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    root = pathlib.Path(env).expanduser()
    if not root.is_dir():
      raise DataError(f"${DATA_DIR_ENV}={env} is not a directory")
    return root.resolve(), f"${DATA_DIR_ENV}"
  sibling = repository_data_root()
  if sibling is not None and sibling.is_dir():
    return sibling, "../shared/data beside the repository"
  return None, f"${DATA_DIR_ENV} is unset and there is no ../shared/data beside the repository"


def default_data_root() -> pathlib.Path | None:
  """The data root of :func:`locate_data_root`, or ``None``."""
  return locate_data_root()[0]


def stdlib_root() -> pathlib.Path:
  """Directory of the running Python's pure-Python standard library."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_python_files() -> list[pathlib.Path]:
  """The standard library's ``.py`` files, sorted by relative path.

  Test suites, ``site-packages``, and the generated codec tables in
  ``encodings/`` are skipped. Raises :class:`DataError` if none are found.
  """
  root = stdlib_root()
  files = []
  for f in root.rglob("*.py"):
    rel = f.relative_to(root)
    if not _STDLIB_SKIP_DIRS.intersection(rel.parts[:-1]) and not _hidden(rel):
      files.append(f)
  if not files:
    raise DataError(f"no Python standard library sources found under {root}")
  return sorted(files, key=lambda f: f.relative_to(root).as_posix())
