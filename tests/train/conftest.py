"""Fixtures for the training tests: a small text corpus, a shared token cache and the config of a short run."""

import pathlib
import random
from typing import Any

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


def tiny_config(out, corpus_dir, cache_dir, **overrides):
  """The TrainConfig of a short run of the `tiny` preset on the test corpus (its tokenizer and tokens cached
  in `cache_dir`) into `out`: S3R-EC (dX), 6 steps at batch 4 x 32 tokens, validated and saved every 3 steps;
  `overrides` replace any field."""
  from s3r.train.config import TrainConfig

  fields: dict[str, Any] = dict(
    out=str(out),
    preset="tiny",
    recipe="s3r_ec_dx",
    steps=6,
    warmup=2,
    batch=4,
    seq=32,
    lr=3e-3,
    data=str(corpus_dir),
    vocab=300,
    cache_dir=str(cache_dir),
    eval_every=3,
    eval_batches=1,
    ckpt_every=3,
    progress=False,
  )
  return TrainConfig(**{**fields, **overrides})
