"""Fixtures for the data-pipeline tests: small corpora written to tmp_path."""

from __future__ import annotations

import gzip
import json
import pathlib

import pytest

from s3r.data import default_data_root, sources


def _write_jsonl(path: pathlib.Path, records: list[dict]) -> pathlib.Path:
  """Write ``records`` as JSON lines (gzip-compressed if the name ends in .gz)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  data = "".join(json.dumps(r) + "\n" for r in records).encode()
  path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
  return path


def _make_docs(n: int, prefix: str = "doc") -> list[str]:
  """``n`` distinct, English-like documents of a few hundred characters."""
  words = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches in paris and london"
  ).split()
  return [f"{prefix} {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(40 + i % 13)) for i in range(n)]


@pytest.fixture
def write_jsonl():
  """``write_jsonl(path, records)``: write JSON lines, gzip-compressed for ``.gz``."""
  return _write_jsonl


@pytest.fixture
def make_docs():
  """``make_docs(n, prefix="doc")``: ``n`` distinct English-like documents."""
  return _make_docs


@pytest.fixture
def no_data_root(monkeypatch):
  """Make prepare() see no shared data root (hermetic: no enwiki, no c4)."""
  monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
  monkeypatch.setattr(sources, "locate_data_root", lambda: (None, "no data root in this test"))


@pytest.fixture
def real_data_root() -> pathlib.Path:
  """The real shared data directory, or skip the test."""
  root = default_data_root()
  if root is None or not (root / "enwiki").is_dir():
    pytest.skip(
      "real corpora not found: set S3R_DATA or provide ../shared/data beside the repository with enwiki/ and c4/"
    )
  return root


class LogLines(list):
  """A ``log`` callable for prepare() that keeps the lines."""

  def __call__(self, line: str) -> None:
    self.append(line)

  def has(self, text: str) -> bool:
    return any(text in line for line in self)


@pytest.fixture
def log() -> LogLines:
  return LogLines()
