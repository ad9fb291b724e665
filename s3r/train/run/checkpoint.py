"""Orbax checkpoints of a run: the TrainState (params, optimizer state, step) plus a JSON
item with the batch loader's position and the run and model configs.

Layout: <out>/checkpoints/<step>/{state,meta}. Saves are synchronous (the train step
donates its state buffers right after), and the last `max_to_keep` checkpoints are kept, plus
the one known to be good (`mark_good`, recorded in checkpoints/known_good.json), which the
rotation never deletes, and with `keep_every` every checkpoint whose step is a multiple of it.
A checkpoint that cannot be read (a truncated or deleted state file, a
garbled or missing meta) is skipped with a one-line note, falling back to the one before
(`restore_latest`, `read_latest_meta`).

A save that fails (a full disk: `CheckpointDiskFull`) leaves no partial folder, and
a writing Checkpointer (create=True, what training opens) removes the temporary folders that an
interrupted save of an earlier process left behind.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp

from s3r.model import stack
from s3r.train.run.logs import RUN_LOG

# A restore fallback: the target abstract state -> (the abstract state of an older layout, converter of
# a state read in that layout to the target's).
Fallback = Callable[[Any], tuple[Any, Callable[[Any], Any]]]

CHECKPOINT_DIR = "checkpoints"
KNOWN_GOOD_FILE = "known_good.json"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def find_checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The checkpoint folder a user means by `path`: a run directory or its checkpoints/ folder."""
  path = pathlib.Path(path).absolute()
  return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


class CorruptCheckpoint(RuntimeError):
  """No checkpoint of a directory can be read."""


class CheckpointDiskFull(RuntimeError):
  """A save failed for a full disk (or quota); its partial folder was removed."""


@dataclasses.dataclass
class _KeepKnownGood:
  """Orbax preservation policy: keeps the checkpoint recorded as known good."""

  checkpointer: Checkpointer

  def should_preserve(self, checkpoints: Sequence, *, context) -> Sequence[bool]:
    good = self.checkpointer.known_good()
    return [good is not None and info.step == good["step"] for info in checkpoints]


class Checkpointer:
  """Saves and restores (TrainState, meta) pairs under one directory."""

  def __init__(
    self, directory: str | pathlib.Path, *, max_to_keep: int = 2, keep_every: int | None = None, create: bool = True
  ):
    """Keeps the last `max_to_keep` checkpoints, the known-good one and, with `keep_every`, every
    checkpoint whose step is a multiple of it."""
    self.directory = pathlib.Path(directory).absolute()
    policies: list = [ocp.checkpoint_managers.LatestN(max_to_keep), _KeepKnownGood(self)]
    if keep_every is not None:
      policies.append(ocp.checkpoint_managers.EveryNSteps(keep_every))
    keep = ocp.checkpoint_managers.AnyPreservationPolicy(policies)
    if create:  # temporary folders of a save cut short; removed here, synchronously (Orbax's own clean-up runs in
      # a background thread, which fails noisily when a failed run's directory is removed under it)
      for tmp in self.directory.glob("*.orbax-checkpoint-tmp*"):
        shutil.rmtree(tmp, ignore_errors=True)
    options = ocp.CheckpointManagerOptions(
      create=create, enable_async_checkpointing=False, cleanup_tmp_directories=False, preservation_policy=keep
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._failed: set[int] = set()  # steps whose save failed: their debris is removed again on close

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> pathlib.Path:
    """Writes checkpoint `step` (overwriting one with the same number); returns its path.
    A failed save leaves nothing behind; CheckpointDiskFull if the disk was full, else the error re-raised."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    if step in self.all_steps():  # e.g. a damaged checkpoint that a resume fell back past
      self._manager.delete(step)
    if (self.known_good() or {}).get("step") == step:  # what vouched for it was about the old contents
      (self.directory / KNOWN_GOOD_FILE).unlink(missing_ok=True)
    try:
      self._manager.save(step, args=args, force=True)
      self._manager.wait_until_finished()
    except Exception as e:  # tensorstore, orbax and file-system errors all end here
      self._remove_partial(step)
      if not disk_full(e):
        raise
      raise CheckpointDiskFull(f"checkpoint {step} could not be written to {self.directory}") from e
    return self.directory / str(step)

  def _remove_partial(self, step: int) -> None:
    """Removes the folder of a failed save of `step` and its temporary folders (once the save's other
    writes have stopped), and forgets the step."""
    try:
      self._manager.wait_until_finished()
    except Exception:  # the same failure, reported again by the writes still in flight
      pass
    _settle_pending_writes()
    self._failed.add(step)
    self._remove_debris(step)
    self._manager.reload()

  def _remove_debris(self, step: int) -> None:
    for path in [self.directory / str(step), *self.directory.glob(f"{step}.orbax-checkpoint-tmp*")]:
      shutil.rmtree(path, ignore_errors=True)

  def known_good(self) -> dict | None:
    """{"step": N, ...} of the checkpoint recorded as known good (see `mark_good`), or None."""
    try:
      good = json.loads((self.directory / KNOWN_GOOD_FILE).read_text())
    except (OSError, ValueError):
      return None
    return good if isinstance(good, dict) and isinstance(good.get("step"), int) else None

  def mark_good(self, step: int, **why) -> None:
    """Records checkpoint `step` as known good (kept out of the rotation until a later one replaces it);
    `why` (e.g. the losses that vouch for it) is stored beside it."""
    path = self.directory / KNOWN_GOOD_FILE
    tmp = path.with_name(f".{KNOWN_GOOD_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"step": step, **why}))
    os.replace(tmp, path)

  def set_aside(self, steps: Sequence[int], destination: pathlib.Path) -> list[pathlib.Path]:
    """Moves checkpoints `steps` out of this directory into `destination` (kept, no longer resumed from);
    their new paths."""
    destination.mkdir(parents=True, exist_ok=True)
    moved = []
    for step in steps:
      if (self.directory / str(step)).is_dir():
        moved.append(pathlib.Path(shutil.move(self.directory / str(step), destination / str(step))))
    self._manager.reload()
    return moved

  def read_meta(self, step: int | None = None) -> dict:
    """The JSON item of checkpoint `step` (default: the latest)."""
    step = self._require(step)
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore[S](
    self, abstract_state: S, step: int | None = None, *, fallback: Fallback | None = None
  ) -> tuple[S, dict]:
    """(state, meta) of checkpoint `step`; `abstract_state` gives shapes, dtypes and shardings.
    `fallback` (see `per_layer_fallback`): an older layout tried when the checkpoint does not hold
    `abstract_state`'s, converted after reading."""
    step = self._require(step)
    read = lambda abstract: self._manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
    )
    try:
      restored = read(abstract_state)
    except Exception as error:  # orbax reports a tree that differs from the target as any of several errors
      if fallback is None:
        raise
      old_abstract, convert = fallback(abstract_state)
      try:
        restored = read(old_abstract)
      except Exception:
        raise error from None
      return convert(restored["state"]), restored["meta"]
    return restored["state"], restored["meta"]

  def read_latest_meta(self, log=print) -> tuple[int, dict]:
    """(step, meta) of the newest checkpoint whose meta is readable (see `restore_latest`)."""
    return self._newest_readable(lambda step: self.read_meta(step), log, meta_of=lambda meta: meta)

  def restore_latest[S](
    self, abstract_state: S, log=print, *, newest: int | None = None, fallback: Fallback | None = None
  ) -> tuple[int, S, dict]:
    """(step, state, meta) of the newest checkpoint (at most step `newest`, when given) that restores
    (with `fallback` as in `restore`); unreadable ones are reported through `log` and skipped.
    CorruptCheckpoint if none is readable."""
    read = lambda step: self.restore(abstract_state, step, fallback=fallback)
    step, (state, meta) = self._newest_readable(read, log, meta_of=lambda restored: restored[1], newest=newest)
    return step, state, meta

  def _newest_readable[V](
    self, read: Callable[[int], V], log, *, meta_of: Callable[[V], object], newest: int | None = None
  ) -> tuple[int, V]:
    """(step, read(step)) of the newest checkpoint (up to `newest`) that `read` reads and whose meta
    (`meta_of` what it read) holds a train_config."""
    problems = []
    for step in sorted((s for s in self.all_steps() if newest is None or s <= newest), reverse=True):
      try:
        value = read(step)
      except Exception as e:  # orbax, JSON and file-system errors of a damaged checkpoint all end here
        RUN_LOG.warning("checkpoint step %d of %s is unreadable", step, self.directory, exc_info=True)
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'unreadable'}"[:120]
        problems.append(f"step {step} ({why})")
        continue
      meta = meta_of(value)
      if not isinstance(meta, dict) or "train_config" not in meta:
        problems.append(f"step {step} (meta has no train_config)")
        continue
      if problems:
        log(
          f"checkpoint: using step {step} of {self.directory}; skipped the unreadable newer checkpoint(s) "
          f"{'; '.join(problems)}"
        )
      return step, value
    raise CorruptCheckpoint(
      f"no readable checkpoint in {self.directory}" + (f": {'; '.join(problems)}" if problems else "")
    )

  def _require(self, step: int | None) -> int:
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    return step

  def close(self):
    self._manager.close()
    for step in self._failed:  # a write of a failed save still in flight may have recreated its folder
      self._remove_debris(step)


def unfinished_steps(directory: pathlib.Path) -> list[int]:
  """The steps whose save was cut short in `directory`: a temporary folder that Orbax never renamed into place
  (it does so after every process wrote its part; a writing Checkpointer removes them)."""
  steps = {p.name.split(".")[0] for p in pathlib.Path(directory).glob("*.orbax-checkpoint-tmp*")}
  return sorted(int(s) for s in steps if s.isdigit())


def _settle_pending_writes(timeout_s: float = 30.0) -> None:
  """Lets Orbax's background writes of a failed save end before its folders are removed: a write already
  running (tensorstore keeps writing when its awaiting task is cancelled) is waited for, up to `timeout_s`
  in all; one still waiting for a signal of the failed save is cancelled (left alone, it would run at
  interpreter exit, recreate the temporary folder and log tracebacks)."""
  from orbax.checkpoint._src.futures import future

  signaling = getattr(future, "_SignalingThread", None)
  if signaling is None:
    return
  deadline = time.monotonic() + timeout_s
  for thread in threading.enumerate():
    if isinstance(thread, signaling) and thread.is_alive():
      if getattr(thread, "main_task", None) is not None:  # running its write: let it finish
        threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))
      if thread.is_alive():
        thread.cancel()


def disk_full(error: BaseException) -> bool:
  """Whether `error` (or an exception it was raised from) is a full disk or an exceeded quota; tensorstore
  reports those in its message only."""
  seen, current = set(), error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    if isinstance(current, OSError) and current.errno in DISK_FULL:
      return True
    if any(os.strerror(code) in str(current) for code in DISK_FULL):
      return True
    current = current.__cause__ or current.__context__
  return False


def per_layer_fallback(model_cfg) -> Fallback:
  """The restore fallback for checkpoints that hold the decoder's blocks one subtree per layer
  (`params["blocks"][l]`, as runs saved before the blocks were stacked): they are read in that layout
  and stacked (s3r.model.stack), parameters and optimizer moments alike, onto the target's shardings."""

  def fallback(abstract_state):
    def convert(state):
      stacked = stack.stack_all(state, model_cfg)
      return jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), stacked, abstract_state)

    return stack.unstack_all(abstract_state, model_cfg), convert

  return fallback


def abstract_like(tree, shardings):
  """ShapeDtypeStructs of `tree` (arrays or ShapeDtypeStructs) carrying `shardings`."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
