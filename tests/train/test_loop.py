"""The training loop on `tiny`: outputs, exact resume, divergence handling, run-directory checks."""

import json
import math
import shutil

import jax
import numpy as np
import pytest

from s3r.train import checkpoint, loop
from s3r.train.config import ConfigError, TrainConfig


def _config(tmp_path, corpus_dir, cache_dir, **overrides):
  fields = dict(out=str(tmp_path / "run"), preset="tiny", recipe="s3r_ec_dx", steps=8, warmup=2, batch=4, seq=32,
                lr=3e-3, data=str(corpus_dir), vocab=300, cache_dir=str(cache_dir), eval_every=4, eval_batches=2,
                ckpt_every=4, progress=False)
  return TrainConfig(**{**fields, **overrides})


def _records(cfg):
  return [json.loads(line) for line in open(f"{cfg.out}/metrics.jsonl")]


def _quiet(*_):
  pass


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus_dir, cache_dir):
  """An 8-step tiny run (validation and checkpoints every 4 steps) and its summary."""
  cfg = _config(tmp_path_factory.mktemp("finished"), corpus_dir, cache_dir)
  return cfg, loop.train(cfg, log=_quiet)


def test_run_writes_metrics_plot_config_and_checkpoints(finished_run):
  cfg, summary = finished_run
  records = _records(cfg)
  assert [r["step"] for r in records] == list(range(1, 9))
  assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"} <= set(records[0])
  assert [r["step"] for r in records if "val_loss" in r] == [4, 8]
  assert summary["val_losses"]["val"] == records[-1]["val_loss"]
  assert json.load(open(f"{cfg.out}/config.json"))["train"]["recipe"] == "s3r_ec_dx"
  assert open(f"{cfg.out}/loss.png", "rb").read(4) == b"\x89PNG"
  assert checkpoint.Checkpointer(f"{cfg.out}/checkpoints", create=False).all_steps() == [4, 8]


def test_resume_reproduces_the_uninterrupted_losses_bit_for_bit(finished_run, tmp_path):
  cfg, _ = finished_run
  full = _records(cfg)
  # Interrupt after step 4: a copy of the run without its final checkpoint, continued with --resume.
  copy = TrainConfig(**{**cfg.to_dict(), "out": str(tmp_path / "copy"), "resume": True})
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/8")
  summary = loop.train(copy, log=_quiet)
  resumed = _records(copy)
  assert [r["step"] for r in resumed] == list(range(1, 9))
  for key in ("loss", "grad_norm", "lr", "val_loss", "val_loss_c4"):
    assert [r.get(key) for r in resumed] == [r.get(key) for r in full], key
  assert summary["val_losses"]["val"] == full[-1]["val_loss"]


def test_existing_checkpoints_without_resume_or_with_other_settings_are_refused(finished_run):
  cfg, _ = finished_run
  with pytest.raises(ConfigError, match="--resume"):
    loop.train(cfg, log=_quiet)
  with pytest.raises(ConfigError, match="lr"):
    loop.train(TrainConfig(**{**cfg.to_dict(), "resume": True, "lr": 1e-4}), log=_quiet)


def test_evaluate_checkpoint_matches_the_final_validation_loss(finished_run, corpus_dir):
  cfg, summary = finished_run
  losses = loop.evaluate_checkpoint(cfg.out, log=_quiet)
  assert losses["val"] == pytest.approx(summary["val_losses"]["val"], rel=1e-6)
  other = loop.evaluate_checkpoint(f"{cfg.out}/checkpoints", data=str(corpus_dir / "part0.txt"), log=_quiet)
  assert set(other) == {"val"} and math.isfinite(other["val"])


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, corpus_dir, cache_dir):
  cfg = _config(tmp_path, corpus_dir, cache_dir, lr=1e30, warmup=0, ckpt_every=1)
  with pytest.raises(loop.TrainingDiverged, match=r"non-finite .* at step (\d+)") as info:
    loop.train(cfg, log=_quiet)
  bad_step = int(info.value.args[0].split("at step ")[1].split()[0])
  ckpt = checkpoint.Checkpointer(f"{cfg.out}/checkpoints", create=False)
  assert ckpt.latest_step() == bad_step - 1
  assert str(ckpt.directory / str(bad_step - 1)) in str(info.value)
  setup = loop.build(cfg, 300, loop.make_mesh(cfg))
  state, _ = ckpt.restore(setup.abstract_state)
  assert all(bool(np.all(np.isfinite(x))) for x in jax.tree.leaves(state.params))
  assert all(math.isfinite(r["loss"]) for r in _records(cfg))
