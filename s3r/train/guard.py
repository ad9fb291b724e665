"""What keeps a run safe: one training per run directory, Ctrl-C, and divergence detection.

* `RunLock`: an exclusive `fcntl.flock` on <out>/.lock held for the whole run; a second
  training on the same directory is refused. The kernel drops the lock when its process
  dies (even by SIGKILL), so a stale lock never blocks.
* `Interrupts`: while training, SIGINT (Ctrl-C) and SIGTERM only set a flag; the loop then
  saves a checkpoint and stops (`TrainingInterrupted`). A second Ctrl-C interrupts at once.
* `DivergenceMonitor`: stops on a non-finite loss or gradient norm, on a loss far above its
  running level (a blow-up) and on a gradient norm of exactly 0 (dead training).
"""

from __future__ import annotations

import fcntl
import math
import os
import pathlib
import signal
import threading

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
  """Context manager: SIGINT/SIGTERM set `requested` (a second SIGINT raises KeyboardInterrupt).
  Only in the main thread; elsewhere signals keep their handlers."""

  def __init__(self):
    self.requested: str | None = None
    self._previous = {}

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = signal.Signals(signum).name

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

  The running level is an exponential moving average (decay `decay`) of the finite losses,
  started at the initial (step-0) loss; a loss above `blowup` times that level is a blow-up.
  """

  def __init__(self, initial_loss: float | None, *, blowup: float = 3.0, decay: float = 0.9):
    self.level = initial_loss if initial_loss is not None and math.isfinite(initial_loss) else None
    self.blowup, self.decay = blowup, decay

  def check(self, step: int, loss: float, grad_norm: float) -> str | None:
    """Why training diverged at `step`, or None (then the loss enters the running level)."""
    if not math.isfinite(loss) or not math.isfinite(grad_norm):
      what = "loss" if not math.isfinite(loss) else "gradient norm"
      return f"non-finite {what} at step {step} (loss {loss}, grad_norm {grad_norm})"
    if grad_norm == 0.0:
      return f"dead training at step {step}: gradient norm exactly 0 (loss {loss:.4f})"
    if self.level is not None and loss > self.blowup * self.level:
      return (
        f"loss blew up at step {step}: {loss:.4g}, more than {self.blowup:g}x its running level "
        f"{self.level:.4g} (grad_norm {grad_norm:.4g})"
      )
    self.level = loss if self.level is None else self.decay * self.level + (1 - self.decay) * loss
    return None
