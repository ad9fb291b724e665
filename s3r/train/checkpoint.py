"""Orbax checkpoints of a run: the TrainState (params, optimizer state, step) plus a JSON
item with the batch loader's position and the run and model configs.

Layout: <out>/checkpoints/<step>/{state,meta}. Saves are synchronous (the train step
donates its state buffers right after), and the last `max_to_keep` checkpoints are kept.
A checkpoint that cannot be read (a truncated or deleted state file, a garbled or missing
meta) is skipped with a one-line note, falling back to the one before (`restore_latest`,
`read_latest_meta`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def find_checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The checkpoint folder a user means by `path`: a run directory or its checkpoints/ folder."""
  path = pathlib.Path(path).absolute()
  return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


class CorruptCheckpoint(RuntimeError):
  """No checkpoint of a directory can be read."""


class Checkpointer:
  """Saves and restores (TrainState, meta) pairs under one directory."""

  def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 2, create: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> pathlib.Path:
    """Writes checkpoint `step` (overwriting one with the same number); returns its path."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    if step in self.all_steps():  # e.g. a damaged checkpoint that a resume fell back past
      self._manager.delete(step)
    self._manager.save(step, args=args, force=True)
    self._manager.wait_until_finished()
    return self.directory / str(step)

  def read_meta(self, step: int | None = None) -> dict:
    """The JSON item of checkpoint `step` (default: the latest)."""
    step = self._require(step)
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore[S](self, abstract_state: S, step: int | None = None) -> tuple[S, dict]:
    """(state, meta) of checkpoint `step`; `abstract_state` gives shapes, dtypes and shardings."""
    step = self._require(step)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
    restored = self._manager.restore(step, args=args)
    return restored["state"], restored["meta"]

  def read_latest_meta(self, log=print) -> tuple[int, dict]:
    """(step, meta) of the newest checkpoint whose meta is readable (see `restore_latest`)."""
    return self._newest_readable(lambda step: self.read_meta(step), log, meta_of=lambda meta: meta)

  def restore_latest[S](self, abstract_state: S, log=print, *, newest: int | None = None) -> tuple[int, S, dict]:
    """(step, state, meta) of the newest checkpoint (at most step `newest`, when given) that restores;
    unreadable ones are reported through `log` and skipped. CorruptCheckpoint if none is readable."""
    read = lambda step: self.restore(abstract_state, step)
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


def abstract_like(tree, shardings):
  """ShapeDtypeStructs of `tree` (arrays or ShapeDtypeStructs) carrying `shardings`."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
