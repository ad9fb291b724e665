"""What keeps a run safe: one training per run directory, Ctrl-C, and divergence detection.

* `RunLock`: an exclusive `fcntl.flock` on <out>/.lock held for the whole run; a second
  training on the same directory is refused. The kernel drops the lock when its process
  dies (even by SIGKILL), so a stale lock never blocks.
* `Interrupts`: while training, SIGINT (Ctrl-C) and SIGTERM only set a flag; the loop then
  saves a checkpoint and stops (`TrainingInterrupted`). A second Ctrl-C interrupts at once
  (KeyboardInterrupt), except inside `Interrupts.deferred()` (a checkpoint being written):
  there every signal waits until the block ends, so a save is never cut short.
* `DivergenceMonitor`: stops on a non-finite loss or gradient norm (naming the first parameter whose
  gradient is not finite, `param_name`), on a loss far above its
  running level (a blow-up), on a loss that rose fast over consecutive steps, on a loss that stays
  well above the initial one (worse than the model training started from) and on a gradient
  norm of exactly 0 (dead training).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import pathlib
import signal
import threading
from collections import deque

from s3r.train.config import ConfigError

LOCK_FILE = ".lock"


class TrainingDiverged(RuntimeError):
  """The loss blew up, became non-finite, or training died (gradient norm exactly 0)."""


class TrainingInterrupted(RuntimeError):
  """Stopped by SIGINT/SIGTERM after saving a checkpoint."""


class RunLock:
  """Exclusive lock of a run directory (context manager); ConfigError if another process holds it."""

  def __init__(self, out: pathlib.Path):
    self.path = pathlib.Path(out) / LOCK_FILE
    self._fd = None

  def __enter__(self):
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
      os.close(fd)
      raise ConfigError(
        f"another training is running on {self.path.parent} (pid {holder}); wait for it to end or choose another --out"
      ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


class Interrupts:
  """Context manager: SIGINT/SIGTERM set `requested` (a second SIGINT raises KeyboardInterrupt, but not
  inside `deferred()`). Only in the main thread; elsewhere signals keep their handlers."""

  def __init__(self):
    self.requested: str | None = None
    self.deferred_count = 0  # second SIGINTs that arrived inside `deferred()`
    self._deferring = False
    self._previous = {}

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      if self._deferring:
        self.deferred_count += 1
        return
      raise KeyboardInterrupt
    self.requested = self.requested or signal.Signals(signum).name

  @contextlib.contextmanager
  def deferred(self):
    """A block no signal cuts short: signals only set `requested`; the caller checks it afterwards."""
    previous, self._deferring = self._deferring, True
    try:
      yield self
    finally:
      self._deferring = previous

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGINT, signal.SIGTERM):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()


class DivergenceMonitor:
  """Flags the first step whose metrics show divergence (see `check`).

  The running level is an exponential moving average (decay `decay`) of the accepted losses, started
  at the initial (step-0) loss. A blow-up is a loss more than `blowup` times that level and more than
  `blowup_nats` above it; a fast rise is a loss that went up on each of the last `rise_steps` steps by
  more than `rise_nats` and `rise_fraction` of the level in all. A loss more than `above_start_nats`
  above the initial loss on `above_start_steps` consecutive steps is a model worse than the one training
  started from: a slow blow-up that the running level follows up (5.7 -> 10 -> 8 -> 10). The
  absolute margins keep the noise of a low, overfitting loss (0.75 -> 1.2 between steps of a
  60-document corpus) from counting; the tests (tests/train/test_guard.py) replay committed healthy
  curves through these defaults.
  """

  def __init__(
    self,
    initial_loss: float | None,
    *,
    blowup: float = 2.0,
    blowup_nats: float = 1.0,
    rise_steps: int = 3,
    rise_nats: float = 1.5,
    rise_fraction: float = 0.25,
    decay: float = 0.9,
    above_start_nats: float = 1.0,
    above_start_steps: int = 2,
  ):
    self.level = initial_loss if initial_loss is not None and math.isfinite(initial_loss) else None
    self.initial = self.level
    self.above_start_nats, self.above_start_steps = above_start_nats, above_start_steps
    self._above_start = 0  # consecutive accepted losses above initial + above_start_nats
    self.blowup, self.blowup_nats, self.decay = blowup, blowup_nats, decay
    self.rise_steps, self.rise_nats, self.rise_fraction = rise_steps, rise_nats, rise_fraction
    self._recent: deque[float] = deque([self.level] if self.level is not None else [], maxlen=rise_steps + 1)

  @classmethod
  def following(cls, losses: list[float], **kwargs) -> DivergenceMonitor:
    """A monitor whose running level has seen `losses` (the initial loss first: a resumed run's metrics)."""
    monitor = cls(losses[0] if losses else None, **kwargs)
    for loss in losses[1:]:
      if math.isfinite(loss):
        monitor._accept(loss)
    return monitor

  def check(self, step: int, loss: float, grad_norm: float, nonfinite_grad: str | None = None) -> str | None:
    """Why training diverged at `step`, or None (then the loss enters the running level).

    `nonfinite_grad` names the first parameter whose gradient is not finite, if the step saw one: a
    non-finite loss or gradient norm is reported with it."""
    if not math.isfinite(loss) or not math.isfinite(grad_norm):
      what = "loss" if not math.isfinite(loss) else "gradient norm"
      where = f"; first non-finite gradient: {nonfinite_grad}" if nonfinite_grad else ""
      return f"non-finite {what} at step {step} (loss {loss}, grad_norm {grad_norm}{where})"
    if grad_norm == 0.0:
      return f"dead training at step {step}: gradient norm exactly 0 (loss {loss:.4f})"
    if why := (
      self._blown_up(step, loss, grad_norm) or self._rising(step, loss, grad_norm) or self._above_initial(step, loss)
    ):
      return why
    self._accept(loss)
    return None

  def _accept(self, loss: float) -> None:
    self.level = loss if self.level is None else self.decay * self.level + (1 - self.decay) * loss
    self._recent.append(loss)
    above = self.initial is not None and loss - self.initial > self.above_start_nats
    self._above_start = self._above_start + 1 if above else 0

  def _blown_up(self, step: int, loss: float, grad_norm: float) -> str | None:
    level = self.level
    if level is None or loss <= self.blowup * level or loss - level <= self.blowup_nats:
      return None
    return (
      f"loss blew up at step {step}: {loss:.4g}, more than {self.blowup:g}x its running level "
      f"{level:.4g} (grad_norm {grad_norm:.4g})"
    )

  def _above_initial(self, step: int, loss: float) -> str | None:
    if self.initial is None or loss - self.initial <= self.above_start_nats:
      return None
    if self._above_start + 1 < self.above_start_steps:
      return None
    return (
      f"loss stayed above the initial loss {self.initial:.4g} at step {step}: {loss:.4g}, more than "
      f"{self.above_start_nats:g} nat above it on {self.above_start_steps} steps in a row"
    )

  def _rising(self, step: int, loss: float, grad_norm: float) -> str | None:
    window = [*self._recent, loss][-(self.rise_steps + 1) :]
    if self.level is None or len(window) <= self.rise_steps or any(b <= a for a, b in zip(window, window[1:])):
      return None
    rise = loss - window[0]
    if rise <= self.rise_nats or rise <= self.rise_fraction * self.level:
      return None
    return (
      f"loss rose fast at step {step}: {window[0]:.4g} -> {loss:.4g} over {self.rise_steps} steps, each "
      f"above the one before (running level {self.level:.4g}, grad_norm {grad_norm:.4g})"
    )


def param_name(params, index: int) -> str | None:
  """The path ("blocks/0/attn/wq") of leaf `index` of `params` in `jax.tree.leaves` order; None for -1."""
  if index < 0:
    return None
  import jax  # the guard's other parts run without JAX

  path, _ = jax.tree_util.tree_flatten_with_path(params)[0][index]
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
