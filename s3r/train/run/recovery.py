"""What a stopped run leaves to continue from: the checkpoint known to be good, and the messages.

A checkpoint of step s holds the parameters after update s; the loss of step s + 1 is the first
to measure them. So checkpoint s is *known good* once the GOOD_AFTER steps after it (s + 1 ..
s + GOOD_AFTER) passed the divergence monitor with losses within a tighter band, at most
max(GOOD_RATIO x, GOOD_NATS nats above) the monitor's running level at the save, and, when
validation ran at step s, its validation loss was at most VAL_MARGIN nats above the best one of
the session. The newest
known-good checkpoint is recorded (checkpoints/known_good.json) and kept out of the rotation.

When the run diverges (`diverged`), the checkpoints written after the known-good one are moved
to <out>/diverged/<step>/checkpoints/ with a copy of metrics.jsonl, so the known-good one is the
newest and `s3r train --out RUN --resume --lr LOWER` continues from it; the lower peak is
recorded as a schedule change (TrainConfig.lr_changes).
"""

from __future__ import annotations

import math
import pathlib
import shutil
from typing import Protocol

from s3r.train.config import TrainConfig
from s3r.train.run import checkpoint, report

GOOD_AFTER = 2  # healthy steps after a checkpoint that make it known good
GOOD_RATIO, GOOD_NATS = 1.25, 0.5  # how far above the running level those steps' losses may be
VAL_MARGIN = 1.0  # nats above the session's best validation loss that a known-good checkpoint may be
DIVERGED_DIR = "diverged"


class GoodMarks(Protocol):
  """What GoodCheckpoints needs of a `checkpoint.Checkpointer`: the known-good record, and marking one."""

  def known_good(self) -> dict | None: ...

  def mark_good(self, step: int, **why) -> None: ...


class GoodCheckpoints:
  """Confirms checkpoints as known good as the healthy steps after them come in (see the module)."""

  def __init__(self, ckpt: GoodMarks, *, resumed_from: int | None = None):
    self.ckpt = ckpt
    self.best_val = math.inf
    self._pending: dict[int, list] = {}  # checkpoint step -> [healthy steps seen after it, loss bound]
    good = ckpt.known_good()
    self._confirm_resumed = bool(resumed_from) and (good is None or good["step"] != resumed_from)

  def saw_validation(self, val_loss: float | None) -> None:
    if val_loss is not None and math.isfinite(val_loss):
      self.best_val = min(self.best_val, val_loss)

  def saved(self, step: int, level: float | None, val_loss: float | None = None) -> None:
    """Checkpoint `step` was written when the monitor's running level was `level` (with validation loss
    `val_loss` at that step, if any)."""
    if level is None or (val_loss is not None and not val_loss <= self.best_val + VAL_MARGIN):
      return  # nothing to judge it by, or its validation loss already says it is not good
    self._pending[step] = [0, max(GOOD_RATIO * level, level + GOOD_NATS)]

  def healthy(self, step: int, loss: float, level: float | None) -> None:
    """The monitor accepted step `step` (loss `loss`; its level before it `level`): confirms the checkpoints
    with GOOD_AFTER such steps within their bound, forgets those with a step above it."""
    if self._confirm_resumed:  # the checkpoint resumed from, judged like one just written
      self._confirm_resumed = False
      self.saved(step - 1, level)
    for saved in sorted(self._pending):
      seen, bound = self._pending[saved]
      if not loss <= bound:
        del self._pending[saved]
        continue
      self._pending[saved][0] = seen + 1
      if seen + 1 >= GOOD_AFTER:
        del self._pending[saved]
        self.ckpt.mark_good(saved, confirmed_at=step, loss=loss, bound=bound)


def diverged(cfg: TrainConfig, ckpt: checkpoint.Checkpointer, step: int, *, main: bool) -> str:
  """After a divergence at `step`: sets the checkpoints after the known-good one aside (process 0) and
  says what to continue from and how."""
  good = ckpt.known_good()
  lower = f"{cfg.current_lr / 10:.2g}"
  if good is None or good["step"] not in ckpt.all_steps():
    latest = ckpt.latest_step()
    written = "" if latest is None else f"the latest is {ckpt.directory / str(latest)}, which may already be affected; "
    return (
      f"no checkpoint is known to be good (none had {GOOD_AFTER} healthy steps after it); {written}"
      f"start again with a lower peak, e.g. --lr {lower}, and another --out"
    )
  path = ckpt.directory / str(good["step"])
  after = [s for s in ckpt.all_steps() if s > good["step"]]
  aside = ""
  if after:
    where = pathlib.Path(cfg.out).absolute() / DIVERGED_DIR / str(step)
    if main:
      moved = ckpt.set_aside(after, where / checkpoint.CHECKPOINT_DIR)
      metrics = pathlib.Path(cfg.out) / report.METRICS_FILE
      if metrics.exists():
        shutil.copy2(metrics, where / report.METRICS_FILE)
      aside = f" (the later checkpoint(s) {', '.join(p.name for p in moved)} were moved to {where})"
  return (
    f"{path} is the last checkpoint known to be good{aside}; continue from it with a lower peak learning rate: "
    f"s3r train --out {cfg.out} --resume --lr {lower}"
  )


def latest_intact(ckpt: checkpoint.Checkpointer, last_saved: pathlib.Path | None) -> str:
  """Which checkpoint a run stopped without saving can continue from."""
  if last_saved:
    return f"the latest intact checkpoint is {last_saved}"
  latest = ckpt.latest_step()
  return (
    "no checkpoint was written" if latest is None else f"the latest intact checkpoint is {ckpt.directory / str(latest)}"
  )
