"""A run whose checkpoints hold the per-layer layout of the blocks (`params["blocks"][l]`, as runs saved
before the blocks were stacked) evaluates and resumes: the checkpoint is stacked on restore."""

import json

import jax
import numpy as np
import pytest

from s3r import cli
from s3r.model import stack
from s3r.train import evaluate
from s3r.train.run import checkpoint
from tests.train.conftest import write_corpus


@pytest.mark.slow  # trains, evaluates and resumes a tiny run: three compiled programs
def test_an_old_layout_run_evaluates_and_resumes(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  write_corpus(tmp_path / "data")
  argv = ["train", "--preset", "tiny", "--recipe", "s3r", "--steps", "2", "--batch", "2", "--seq", "32"]
  argv += ["--vocab", "300", "--data", "data", "--out", "run", "--eval-every", "2", "--ckpt-every", "2"]
  argv += ["--eval-batches", "1", "--cache-dir", "cache", "--no-progress"]
  assert cli.main(argv) == 0
  want = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]
  restored = evaluate.restore_run("run", log=lambda *_: None)
  ckpt = checkpoint.Checkpointer(tmp_path / "run" / "checkpoints")
  old = stack.unstack_all(restored.state, restored.setup.model_cfg)
  assert 0 in old.params["blocks"] and "layers" not in old.params
  ckpt.save(2, old, restored.meta)  # rewritten in the per-layer layout
  ckpt.close()
  capsys.readouterr()

  assert cli.main(["eval", "run", "--eval-batches", "1"]) == 0
  val = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("val:"))
  assert f"loss {want:.4f}" in val
  again = evaluate.restore_run("run", log=lambda *_: None)  # stacked on restore: the state as it was trained
  assert jax.tree.structure(again.state) == jax.tree.structure(restored.state)
  for a, b in zip(jax.tree.leaves(again.state), jax.tree.leaves(restored.state)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  assert cli.main(["train", "--out", "run", "--resume", "--steps", "3", "--no-progress"]) == 0
  assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1] == 3
