"""A small real-text corpus for end-to-end experiment tests."""

import pathlib
from typing import Any

import pytest

from tests.train.conftest import write_corpus


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> pathlib.Path:
  return write_corpus(tmp_path_factory.mktemp("corpus"))


def tiny_sweep_config(tmp_path: pathlib.Path, corpus: pathlib.Path, **kw):
  """A sweep of real `tiny` runs of 4 steps on `corpus` (checkpoints and evaluations every 2 steps)."""
  from research import protocol

  base: dict[str, Any] = dict(
    name="t",
    seeds=1,
    preset="tiny",
    steps=4,
    warmup=1,
    batch=2,
    seq=32,
    eval_every=2,
    eval_batches=1,
    data=str(corpus),
    runs_dir=str(tmp_path / "runs"),
    results_dir=str(tmp_path / "results"),
  )
  return protocol.SweepConfig(**{**base, **kw})
