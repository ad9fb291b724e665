"""The training loop on `tiny`: outputs, exact resume and extension, divergence handling, evaluation, checks."""

import dataclasses
import json
import math
import shutil
from typing import Any

import jax
import numpy as np
import pytest

from s3r.train import loop
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import checkpoint
from tests.train.conftest import tiny_config

# The runs of this module: 8 steps, validated (on 2 batches) and saved every 4.
RUN: dict[str, Any] = dict(steps=8, eval_every=4, eval_batches=2, ckpt_every=4)


def _records(cfg):
  return [json.loads(line) for line in open(f"{cfg.out}/metrics.jsonl")]


def _quiet(*_):
  pass


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus_dir, cache_dir):
  """An 8-step tiny run (validation and checkpoints every 4 steps) and its summary."""
  cfg = tiny_config(tmp_path_factory.mktemp("finished") / "run", corpus_dir, cache_dir, **RUN)
  return cfg, loop.train(cfg, log=_quiet)


def test_run_writes_metrics_plot_config_and_checkpoints(finished_run):
  cfg, summary = finished_run
  records = _records(cfg)
  assert [r["step"] for r in records] == list(range(0, 9))
  assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "wall_s"} <= set(records[1])
  assert [r["step"] for r in records if "val_loss" in r] == [0, 4, 8]
  # Step 0 is the initial loss: the forward pass of step 1 sees the same parameters and batch.
  assert records[0]["loss"] == pytest.approx(records[1]["loss"], rel=1e-6) and records[0]["lr"] == 0.0
  assert summary["val_losses"]["val"] == records[-1]["val_loss"]
  assert json.load(open(f"{cfg.out}/config.json"))["train"]["recipe"] == "s3r_ec_dx"
  assert open(f"{cfg.out}/loss.png", "rb").read(4) == b"\x89PNG"
  assert checkpoint.Checkpointer(f"{cfg.out}/checkpoints", create=False).all_steps() == [4, 8]


def test_resume_reproduces_the_uninterrupted_losses_bit_for_bit(finished_run, tmp_path):
  cfg, _ = finished_run
  full = _records(cfg)
  # Interrupt after step 4: a copy of the run without its final checkpoint, continued with --resume.
  copy = dataclasses.replace(cfg, out=str(tmp_path / "copy"), resume=True)
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/8")
  summary = loop.train(copy, log=_quiet)
  resumed = _records(copy)
  assert [r["step"] for r in resumed] == list(range(0, 9))
  assert resumed[5]["wall_s"] > resumed[4]["wall_s"]  # the clock continues from the checkpoint
  for key in ("loss", "grad_norm", "lr", "val_loss", "val_loss_c4"):
    assert [r.get(key) for r in resumed] == [r.get(key) for r in full], key
  assert summary["val_losses"]["val"] == full[-1]["val_loss"]


def test_existing_checkpoints_without_resume_or_with_other_settings_are_refused(finished_run):
  cfg, _ = finished_run
  with pytest.raises(ConfigError, match="--resume"):
    loop.train(cfg, log=_quiet)
  with pytest.raises(ConfigError, match="lr"):
    loop.train(dataclasses.replace(cfg, resume=True, lr=1e-2), log=_quiet)  # a higher peak


def test_evaluate_checkpoint_matches_the_final_validation_loss(finished_run, corpus_dir):
  cfg, summary = finished_run
  losses = loop.evaluate_checkpoint(cfg.out, log=_quiet)
  assert losses["val"] == pytest.approx(summary["val_losses"]["val"], rel=1e-6)
  other = loop.evaluate_checkpoint(f"{cfg.out}/checkpoints", data=str(corpus_dir / "part0.txt"), log=_quiet)
  assert set(other) == {"val"} and math.isfinite(other["val"])


def _poison(out, step: int) -> None:
  """Overwrites checkpoint `step` of run `out` with NaN parameters (what a numerical fault leaves)."""
  ckpt = checkpoint.Checkpointer(f"{out}/checkpoints", create=False)
  meta = ckpt.read_meta(step)
  cfg = TrainConfig.from_dict(meta["train_config"])
  setup = loop.build(cfg, len(json.loads(meta["tokenizer"])["model"]["vocab"]), loop.make_mesh(cfg))
  state, meta = ckpt.restore(setup.abstract_state, step)
  state = state._replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
  ckpt.save(step, state, meta)
  ckpt.close()


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_metrics_and_plot(finished_run, tmp_path):
  cfg, _ = finished_run
  copy = dataclasses.replace(cfg, out=str(tmp_path / "copy"), resume=True)
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/8")
  (tmp_path / "copy" / "loss.png").unlink()
  _poison(copy.out, 4)
  with pytest.raises(loop.TrainingDiverged, match=r"non-finite loss at step 5 .* the latest is .*checkpoints/4"):
    loop.train(copy, log=_quiet)
  assert [r["step"] for r in _records(copy)] == list(range(0, 5))  # nothing before the fault lost
  assert (tmp_path / "copy" / "loss.png").exists()  # the plot is still written


def test_resume_with_more_steps_extends_the_run_on_a_stretched_schedule(finished_run, tmp_path):
  from s3r.train.step.optimizer import schedule

  cfg, _ = finished_run
  # checkpoints every 2 steps from the resume on, keeping every 4th besides the last two
  changes = {"resume": True, "steps": 12, "ckpt_every": 2, "keep_every": 4}
  longer = dataclasses.replace(cfg, out=str(tmp_path / "longer"), **changes)
  shutil.copytree(cfg.out, longer.out)
  loop.train(longer, log=_quiet)
  kept = checkpoint.Checkpointer(f"{longer.out}/checkpoints", create=False).all_steps()
  assert {4, 8, 10, 12} <= set(kept) and len(kept) <= 5  # at most one more: the known-good one
  records, full = _records(longer), _records(cfg)
  assert [r["step"] for r in records] == list(range(0, 13))
  assert [r["loss"] for r in records[:9]] == [r["loss"] for r in full]  # steps before the extension kept
  stretched = schedule(longer.optimizer_config())
  for r in records[9:]:
    assert r["lr"] == pytest.approx(float(stretched(r["step"] - 1)), rel=1e-6)


def test_a_train_step_needing_more_memory_than_is_free_is_refused_before_it_runs(
  tmp_path, corpus_dir, cache_dir, monkeypatch
):
  from s3r.train import builder as setup

  monkeypatch.setattr(setup, "free_device_memory", lambda: 1024)
  monkeypatch.setattr(setup, "attention_scores_bytes", lambda *_: 0)  # the compiled estimate, not the early floor
  cfg = tiny_config(tmp_path / "run", corpus_dir, cache_dir, **RUN)
  with pytest.raises(setup.ResourceError, match=r"needs about .* GiB per device .* lower --batch or --seq"):
    loop.train(cfg, log=_quiet)
  assert not (tmp_path / "run").exists()  # the run directory it created is removed again


def test_eval_resolves_names_under_the_data_root_and_warns_about_training_documents(
  finished_run, corpus_dir, monkeypatch
):
  cfg, _ = finished_run
  monkeypatch.setenv("S3R_DATA", str(corpus_dir.parent))
  warnings = []
  losses = loop.evaluate_checkpoint(cfg.out, data=corpus_dir.name, log=_quiet, warn=warnings.append)
  assert losses["val"] == pytest.approx(_records(cfg)[-1]["val_loss"], rel=1e-6)  # its own corpus: its val set
  other = corpus_dir.parent / "mixed.txt"
  other.write_text(corpus_dir.joinpath("part0.txt").read_text())
  loop.evaluate_checkpoint(cfg.out, data="mixed.txt", log=_quiet, warn=warnings.append)
  assert len(warnings) == 1 and "are training documents of this run" in warnings[0]
  n = int(warnings[0].split(" of the ")[0])
  assert 0 < n < 40  # part0 holds 40 documents, most of them (not all) training documents
