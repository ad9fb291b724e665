"""Resuming a run: what its directory holds, read once, and what the resumed run must match.

`find_run(out)` is the one reader of "which run is in this folder, at which step, with which
config": the newest checkpoint whose meta is readable (damaged newer ones are skipped, with a
note), else the run's config.json (a run stopped before its first checkpoint). The command line
merges its flags onto that config, and the loop checks the merged config against it
(`check_config`; a lower --lr becomes a recorded schedule change: `record_lr_change`), restores
that checkpoint (`initial_state`) and checks the corpus against it (`check_corpus`). A
checkpoint restores onto any mesh, so a resumed run whose saved mesh does not fit the devices
present may use one that does (`mesh_for_resume`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax

from s3r import data as s3r_data
from s3r.train.builder import Setup, make_mesh
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.evaluate import tokenizer_change
from s3r.train.run import checkpoint
from s3r.train.step import sharding

NEW_RUN = "start a new run with another --out"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SavedRun:
  """The run in a run directory, as `find_run` read it."""

  config: TrainConfig  # the run's config (from the checkpoint's meta, else config.json)
  step: int | None  # the newest checkpoint with a readable meta; None: the run has no checkpoint
  meta: dict | None  # that checkpoint's meta (loader position, tokenizer, mesh, ...)
  notes: tuple[str, ...] = ()  # the damaged newer checkpoints skipped, in one line


def find_run(out: str | pathlib.Path) -> SavedRun:
  """The run in `out`; ConfigError if `out` holds none (no checkpoint and no config.json) or none of its
  checkpoints has a readable meta."""
  out = pathlib.Path(out)
  directory = out / checkpoint.CHECKPOINT_DIR
  if directory.is_dir():
    ckpt = checkpoint.Checkpointer(directory, create=False)
    try:
      if ckpt.latest_step() is not None:
        notes: list[str] = []
        step, meta = ckpt.read_latest_meta(notes.append)
        if unfinished := [s for s in checkpoint.unfinished_steps(directory) if s > step]:
          notes.append(
            f"checkpoint: the save of step(s) {', '.join(map(str, unfinished))} was cut short (not every process "
            f"finished it; it is removed); resuming from step {step}"
          )
        return SavedRun(config=TrainConfig.from_dict(meta["train_config"]), step=step, meta=meta, notes=tuple(notes))
    except checkpoint.CorruptCheckpoint as e:
      raise ConfigError(f"{e}; {NEW_RUN}") from None
    finally:
      ckpt.close()
  saved = _config_json(out)
  if saved is None:
    raise ConfigError(
      f"--resume: {out} holds no run (no checkpoint and no readable config.json); check --out, or drop "
      f"--resume to start a new run"
    )
  return SavedRun(config=saved, step=None, meta=None)


def _config_json(out: pathlib.Path) -> TrainConfig | None:
  try:
    return TrainConfig.from_dict(json.loads((out / "config.json").read_text())["train"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def check_config(cfg: TrainConfig, saved: SavedRun, log) -> None:
  """ConfigError if `cfg` may not resume `saved` at its step (TrainConfig.resume_mismatches); says when
  a larger --steps stretches the schedule."""
  step = saved.step or 0
  if mismatches := cfg.resume_mismatches(saved.config, at_step=step):
    raise ConfigError(
      "--resume with a different configuration than the checkpoint: "
      + "; ".join(mismatches)
      + " (resume with `s3r train --out RUN --resume` alone to keep the run's settings)"
    )
  if cfg.steps != saved.config.steps:
    log(
      f"resume: --steps {saved.config.steps} -> {cfg.steps}: the cosine schedule is stretched to {cfg.steps} "
      f"steps from step {step} on"
    )


def corpus_error(changes: list[str]) -> ConfigError:
  """The error of a resume whose corpus is not the run's (`changes`: what differs)."""
  return ConfigError(
    f"--resume: the corpus changed since the checkpoint: {'; '.join(changes)}; restore the run's corpus, or "
    f"{NEW_RUN} (without --resume)"
  )


def mesh_spec(shape: dict[str, int]) -> str:
  """{'data': 2, 'expert': 1, 'fsdp': 2, 'tensor': 1} -> 'data=2,fsdp=2' ('data=1' for one device)."""
  return ",".join(f"{axis}={size}" for axis, size in shape.items() if size > 1) or "data=1"


def fitting_mesh(cfg: TrainConfig, n_devices: int | None = None) -> str | None:
  """A mesh for `cfg` on the devices present: `cfg.mesh` when it fits (their number and the batch), else its
  axes shrunk to the devices present (tensor, then fsdp, expert and data kept largest), else data=N, else
  one device (data=1). None (one device) when `cfg.mesh` is None."""
  if cfg.mesh is None:
    return None
  n = jax.device_count() if n_devices is None else n_devices
  for spec in (cfg.mesh, shrink_mesh(cfg.mesh, n), f"data={n}"):
    if spec is not None and _fits(cfg, spec):
      return spec
  return "data=1"


def shrink_mesh(spec: str, n_devices: int) -> str | None:
  """`spec` with each axis cut to a divisor of its size so that the sizes multiply to `n_devices`, or None."""
  shape = dict.fromkeys(sharding.MESH_AXES, 1)
  for part in spec.split(","):
    axis, _, size = (s.strip() for s in part.partition("="))
    if axis not in shape or not size.isdigit() or int(size) < 1:
      return None
    shape[axis] = int(size)
  left = n_devices
  for axis in reversed(sharding.MESH_AXES):
    shape[axis] = math.gcd(shape[axis], left)
    left //= shape[axis]
  return mesh_spec(shape) if left == 1 else None


def _fits(cfg: TrainConfig, spec: str) -> bool:
  try:
    make_mesh(dataclasses.replace(cfg, mesh=spec))
  except ConfigError:
    return False
  return True


def mesh_for_resume(cfg: TrainConfig) -> tuple[TrainConfig, str | None]:
  """(`cfg` on a mesh that fits the devices present, a log line saying so when that is not the run's)."""
  spec = fitting_mesh(cfg)
  if spec == cfg.mesh:
    return cfg, None
  note = (
    f"resume: the run's mesh {cfg.mesh} does not fit the {jax.device_count()} device(s) present; using "
    f"--mesh {spec} (checkpoints reshard on restore)"
  )
  return dataclasses.replace(cfg, mesh=spec), note


def mesh_hint(cfg: TrainConfig) -> str:
  """What to say after a --mesh error: a mesh that fits the devices present."""
  spec = fitting_mesh(cfg) or "data=1"
  reshard = " (checkpoints reshard on restore)" if cfg.resume else ""
  return f"--mesh {spec} fits the {jax.device_count()} device(s) present{reshard}"


def check_corpus(cfg: TrainConfig, corpus: s3r_data.Corpus, meta: dict) -> None:
  """ConfigError naming what changed when the corpus is not the one the checkpoint `meta` was trained on."""
  changes = [change] if (change := tokenizer_change(corpus, cfg, meta)) else []
  n_tokens = meta.get("loader", {}).get("n_tokens")
  if n_tokens is not None and n_tokens != len(corpus.train_tokens):
    changes.append(f"its training split has {len(corpus.train_tokens):,} tokens, the run's had {n_tokens:,}")
  if changes:
    raise corpus_error(changes)


def record_lr_change(cfg: TrainConfig, saved: TrainConfig, step: int, log) -> TrainConfig:
  """`cfg` continuing the run `saved` at `step`; a lower --lr becomes a recorded schedule change (lr_changes)."""
  resumed = cfg.resumed_at(saved, step)
  if resumed.lr_changes != saved.lr_changes:
    log(
      f"resume: peak learning rate {saved.current_lr:g} -> {resumed.current_lr:g} from step {step} on "
      f"(the schedule up to step {step} is unchanged; recorded in lr_changes)"
    )
  return resumed


def initial_state(setup: Setup, ckpt, loader, resume_step: int | None, log):
  """(state, wall-clock seconds already spent): fresh, or the newest readable checkpoint up to `resume_step`."""
  if resume_step is None:
    return setup.init_state(setup.keys["init"]), 0.0
  try:
    fallback = checkpoint.per_layer_fallback(setup.model_cfg)
    step, state, meta = ckpt.restore_latest(setup.abstract_state, log, newest=resume_step, fallback=fallback)
  except checkpoint.CorruptCheckpoint as e:
    raise ConfigError(f"{e}; {NEW_RUN}") from None
  try:
    loader.restore(meta["loader"])
  except ValueError as e:
    raise corpus_error([str(e)]) from None
  log(f"resume: restored step {step} from {ckpt.directory / str(step)}")
  return state, float(meta.get("wall_s", 0.0))
