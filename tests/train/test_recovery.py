"""Recovery from a divergence: which checkpoint is known good, and a lowered peak on --resume."""

import json
from typing import Any

import pytest

from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import recovery


class _Checkpoints:
  """The part of a Checkpointer that GoodCheckpoints uses."""

  def __init__(self, good: int | None = None):
    self.good: dict | None = None if good is None else {"step": good}

  def known_good(self):
    return self.good

  def mark_good(self, step: int, **why):
    self.good = {"step": step, **why}


def _feed(good: recovery.GoodCheckpoints, losses: dict[int, float], saves: dict[int, float | None], level=6.0):
  for step in sorted(losses):
    good.healthy(step, losses[step], level)
    if step in saves:
      good.saved(step, level, saves[step])


def test_a_checkpoint_is_known_good_after_two_healthy_steps_and_not_before():
  ckpt = _Checkpoints()
  good = recovery.GoodCheckpoints(ckpt)
  _feed(good, {1: 6.0, 2: 5.9, 3: 5.8}, {2: None})
  assert ckpt.good is None  # one step after it so far
  _feed(good, {4: 5.7}, {})
  assert ckpt.good is not None and ckpt.good["step"] == 2 and ckpt.good["confirmed_at"] == 4


def test_a_checkpoint_followed_by_a_loss_above_the_tighter_band_is_never_known_good():
  ckpt = _Checkpoints(good=2)
  good = recovery.GoodCheckpoints(ckpt)
  _feed(good, {3: 5.9, 4: 5.8, 5: 9.0, 6: 5.8, 7: 5.7}, {4: None})  # 9.0 > 1.25 x 6.0: under the guard's 2x
  assert ckpt.good == {"step": 2}


def test_a_checkpoint_whose_validation_loss_is_far_above_the_best_is_not_known_good():
  ckpt = _Checkpoints()
  good = recovery.GoodCheckpoints(ckpt)
  good.saw_validation(6.26)
  _feed(good, {1: 6.0, 2: 6.0, 3: 6.0, 4: 6.0}, {2: 24.1})
  assert ckpt.good is None


def test_the_checkpoint_a_run_resumes_from_is_judged_by_the_steps_after_it():
  ckpt = _Checkpoints()
  good = recovery.GoodCheckpoints(ckpt, resumed_from=8)
  _feed(good, {9: 5.0, 10: 5.1}, {}, level=5.0)
  assert ckpt.good is not None and ckpt.good["step"] == 8


def _cfg(**kw) -> TrainConfig:
  fields: dict[str, Any] = {"out": "r", "preset": "tiny", "steps": 20, "lr": 1.0}
  return TrainConfig(**(fields | kw))


def test_a_lower_lr_on_resume_is_allowed_and_recorded_as_a_schedule_change_at_the_resume_step():
  saved = _cfg()
  asked = _cfg(lr=0.002, resume=True)
  assert asked.resume_mismatches(saved, at_step=8) == []
  resumed = asked.resumed_at(saved, 8)
  assert (resumed.lr, resumed.lr_changes, resumed.current_lr) == (1.0, ((8, 0.002),), 0.002)
  again = TrainConfig.from_dict(json.loads(json.dumps(resumed.to_dict())))  # config.json and checkpoint meta
  assert again == resumed and again.resume_mismatches(resumed, at_step=12) == []
  assert again.resumed_at(resumed, 12) == again  # a plain --resume keeps the recorded change


def test_a_higher_lr_on_resume_and_other_changes_are_still_refused():
  saved = _cfg().resumed_at(_cfg(), 4)
  lowered = _cfg(lr=0.01).resumed_at(saved, 4)
  assert any("--lr" in m for m in _cfg(lr=0.5, lr_changes=lowered.lr_changes).resume_mismatches(lowered, at_step=8))
  assert any("--seed" in m for m in _cfg(lr=0.002, seed=1).resume_mismatches(saved, at_step=8))


@pytest.mark.parametrize("changes", [((5, 0.1), (3, 0.01)), ((25, 0.1),), ((5, 2.0),), "x"])
def test_lr_changes_out_of_order_beyond_the_run_or_above_the_maximum_are_refused(changes):
  with pytest.raises(ConfigError, match="TrainConfig.lr_changes"):
    _cfg(lr_changes=changes)


def test_the_known_good_checkpoint_survives_rotation_and_is_forgotten_when_overwritten(tmp_path):
  import jax.numpy as jnp

  from s3r.train.run.checkpoint import Checkpointer

  ckpt = Checkpointer(tmp_path / "checkpoints")
  state, meta = {"w": jnp.ones(3)}, {"train_config": {}}
  ckpt.save(2, state, meta)
  ckpt.mark_good(2)
  for step in (4, 6, 8):
    ckpt.save(step, state, meta)
  assert ckpt.all_steps() == [2, 6, 8]  # the last two, and the known-good one
  ckpt.save(2, state, meta)
  assert ckpt.known_good() is None
  ckpt.close()


def test_keep_every_keeps_the_multiples_besides_the_last_two_and_the_known_good_one(tmp_path):
  import jax.numpy as jnp

  from s3r.train.run.checkpoint import Checkpointer

  ckpt = Checkpointer(tmp_path / "checkpoints", keep_every=4)
  state, meta = {"w": jnp.ones(3)}, {"train_config": {}}
  ckpt.save(2, state, meta)
  ckpt.mark_good(2)
  for step in (4, 6, 8, 10, 14, 18):
    ckpt.save(step, state, meta)
  assert ckpt.all_steps() == [2, 4, 8, 14, 18]  # known good; multiples of 4; the last two
  ckpt.close()
