"""Fixtures for the training tests: a small text corpus and a shared token cache."""

import pathlib
import random

import pytest

WORDS = (
  "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
  "in paris and london before dinner at night"
).split()


def write_corpus(directory: pathlib.Path, n_files: int = 3, docs_per_file: int = 40) -> pathlib.Path:
  """A few .txt files of English-like documents (blank-line separated)."""
  rng = random.Random(0)
  directory.mkdir(parents=True, exist_ok=True)
  for i in range(n_files):
    docs = [" ".join(rng.choice(WORDS) for _ in range(120)) + "." for _ in range(docs_per_file)]
    (directory / f"part{i}.txt").write_text("\n\n\n".join(docs))
  return directory


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> pathlib.Path:
  return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp("cache")
