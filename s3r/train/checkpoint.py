"""Orbax checkpoints of a run: the TrainState (params, optimizer state, step) plus a JSON
item with the batch loader's position and the run and model configs.

Layout: <out>/checkpoints/<step>/{state,meta}. Saves are synchronous (the train step
donates its state buffers right after), and the last `max_to_keep` checkpoints are kept.
"""

from __future__ import annotations

import pathlib

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def find_checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The checkpoint folder a user means by `path`: a run directory or its checkpoints/ folder."""
  path = pathlib.Path(path).absolute()
  return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


class Checkpointer:
  """Saves and restores (TrainState, meta) pairs under one directory."""

  def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 2, create: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                           enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> pathlib.Path:
    """Writes checkpoint `step` (overwriting one with the same number); returns its path."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    self._manager.save(step, args=args, force=True)
    self._manager.wait_until_finished()
    return self.directory / str(step)

  def read_meta(self, step: int | None = None) -> dict:
    """The JSON item of checkpoint `step` (default: the latest)."""
    step = self._require(step)
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, abstract_state, step: int | None = None):
    """(state, meta) of checkpoint `step`; `abstract_state` gives shapes, dtypes and shardings."""
    step = self._require(step)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
    restored = self._manager.restore(step, args=args)
    return restored["state"], restored["meta"]

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
