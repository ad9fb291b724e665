"""A small real-text corpus and a random token folder for end-to-end experiment tests."""

import json
import pathlib
from typing import Any

import numpy as np
import pytest

from tests.train.conftest import write_corpus


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> pathlib.Path:
  return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def token_folder(tmp_path_factory) -> pathlib.Path:
  """A lockstep token folder of random ids (vocabulary 512): 20,000 training and 2,000 validation tokens."""
  rng = np.random.default_rng(0)
  folder = tmp_path_factory.mktemp("tokens")
  np.save(folder / "train.npy", rng.integers(0, 512, 20_000).astype(np.uint16))
  np.save(folder / "val.npy", rng.integers(0, 512, 2_000).astype(np.uint16))
  (folder / "meta.json").write_text(json.dumps({"vocab_size": 512, "corpus": "random"}))
  return folder


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


def precompile_lockstep_here(folder: pathlib.Path, recipes, *, seq: int, steps: int = 4) -> None:
  """What `benchmarks aot --program lockstep --save-executables` writes for a GPU, here for this CPU:
  the `tiny` lockstep train steps (2 layers, vocabulary 512, batch 2) of `recipes`, for a schedule of `steps`."""
  import argparse

  import jax

  from benchmarks import aot_programs
  from labtools import executables

  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("d",))
  args = argparse.Namespace(vocab=512, seq=seq, batch=2, attention="xla", schedule_steps=steps)
  for r in recipes:
    lowered = aot_programs.lower_lockstep(mesh, recipe=r, preset="tiny", layers=2, args=args)
    with executables.fresh_compiles():
      compiled = lowered.compile()
    executables.save(folder, r, lowered, compiled, {"target": "cpu"})
