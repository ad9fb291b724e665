"""`s3r train`: train a decoder with a recipe (s3r.train.loop), one flag per TrainConfig field; resumes a run
and starts the processes of a multi-process run (s3r.train.run.peers)."""

from __future__ import annotations

import argparse
import os

from s3r.cli.common import EXIT_CODES, EXIT_HELP, HelpFormatter, guarded, paragraphs, recipe_name

# `s3r train` flags that are not TrainConfig fields (every field has its flag, `_add_config_flags`).
TRAIN_ONLY_FLAGS = (
  "config",
  "coordinator",
  "num_processes",
  "process_id",
  "distributed",
  "peer_timeout",
  "stall_factor",
)

# Fields whose flag values are checked by a parser of their own (a one-line error at parse time) instead of
# `choices`: a recipe is a registered name or NAME@FORMAT, too many to list.
_FLAG_PARSERS = {"recipe": recipe_name}


def register(subparsers) -> None:
  from s3r.train.config import RESUMABLE_CHANGES, TrainConfig, flag

  changeable = ", ".join(flag(k) for k in RESUMABLE_CHANGES if k not in ("out", "resume", "progress"))
  p = subparsers.add_parser(
    "train",
    help="train a language model with a quantization recipe",
    formatter_class=HelpFormatter,
    description=paragraphs(
      "Train a decoder of any preset's family (Llama 3.1, Qwen3, Gemma 3, Qwen3-MoE, DeepSeek-V2; "
      "`s3r models` lists them); writes metrics.jsonl (from step 0), loss.png (with matplotlib), TensorBoard "
      "event files (with tensorboardX), config.json and checkpoints/ into --out. Only one training may use an "
      "--out at a time."
    ),
    epilog=paragraphs(
      f"Resume: `s3r train --out RUN --resume` continues RUN from its newest readable checkpoint with the run's "
      f"own settings (a damaged newest checkpoint is reported and the one before it used); a folder without a "
      f"run is an error, and so is a corpus that changed since. With --resume only {changeable} and "
      f"{flag('progress')} may change, and --steps may be raised to extend the run: the cosine decay is then "
      f"stretched to the new total from the resumed step on (the learning rate moves to the stretched curve's "
      f"value at that step), and --lr may be lowered (recorded; e.g. after a divergence, whose message names the "
      f"checkpoint known to be good to continue from). Without --mesh, a run whose mesh does not fit the "
      f"devices present resumes on one that does (checkpoints reshard on restore). Ctrl-C saves a checkpoint "
      f"and stops; resume it the same way.",
      "Data: --data NAME is a path, else a folder of the data root: $S3R_DATA, else ../shared/data beside the "
      "repository (enwiki, shakespeare and c4 live there). python-stdlib (the running Python's standard "
      "library) needs no data and is the fallback corpus when there is no enwiki.",
      EXIT_HELP + ".",
    ),
  )
  p.add_argument(
    "--config",
    metavar="FILE",
    help="read the settings from a .json or .toml file whose keys are the flags below (grad_accum or "
    "grad-accum = 4); flags given here override it; a run's own config.json is one (docs/training.md)",
  )
  _add_config_flags(p, TrainConfig)
  g = p.add_argument_group("multi-process training (one process per host or GPU; see docs/scaling.md)")
  g.add_argument(
    "--coordinator",
    default=os.environ.get("JAX_COORDINATOR_ADDRESS"),
    metavar="HOST:PORT",
    help="address of process 0's coordination service (default: $JAX_COORDINATOR_ADDRESS); "
    "starts jax.distributed with --num-processes and --process-id",
  )
  g.add_argument(
    "--num-processes",
    type=int,
    default=_env_int("JAX_NUM_PROCESSES"),
    help="number of processes (default: $JAX_NUM_PROCESSES)",
  )
  g.add_argument(
    "--process-id",
    type=int,
    default=_env_int("JAX_PROCESS_ID"),
    help="this process's index, 0 .. N-1 (default: $JAX_PROCESS_ID)",
  )
  g.add_argument(
    "--distributed",
    action="store_true",
    help="start jax.distributed from the cluster environment (Slurm, Open MPI, TPU pods, Kubernetes) "
    "without --coordinator",
  )
  g.add_argument(
    "--peer-timeout",
    type=_positive_float,
    default=60.0,
    metavar="SECONDS",
    help="a process not heard from for this long is lost: every other one stops with one line naming it, the "
    "last checkpoint all completed and the command to resume (exit code 75)",
  )
  g.add_argument(
    "--stall-factor",
    type=_positive_float,
    default=10.0,
    metavar="K",
    help="a step, validation or save that runs longer than K times its median so far (and longer than "
    "--peer-timeout) is stuck: the run stops as for a lost process",
  )
  p.set_defaults(func=lambda args: guarded(run_train, args))


def _add_config_flags(p: argparse.ArgumentParser, cls) -> None:
  """One flag per field of the config dataclass `cls` (`field_flag`): the type from the annotation, the help,
  choices and metavar from the field's metadata, the default from the field (or its metadata's
  default_help). A bool field is a switch: --NAME when it defaults to False, --no-NAME when to True. Every
  flag's value is None when it is not given (so that --resume keeps the run's own settings)."""
  import dataclasses
  import typing

  from s3r.train.config import field_flag

  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    if f.metadata.get("flag", True) is False:  # set another way (e.g. lr_changes, by resuming with a lower --lr)
      continue
    meta, parser = f.metadata, _FLAG_PARSERS.get(f.name)  # a field with a parser of its own: the parser's type
    kind = _flag_type(hints[f.name]) if parser is None else parser
    plain = f.default not in (None, dataclasses.MISSING) and kind is not bool
    shown = meta.get("default_help") or (f.default if plain else None)
    text = _with_default(meta.get("help") or f.name.replace("_", " "), shown)
    if kind is bool:
      action = "store_false" if f.default is True else "store_true"
      p.add_argument(field_flag(f), dest=f.name, action=action, default=None, help=text)
    else:
      choices, metavar = meta.get("choices"), meta.get("metavar")
      p.add_argument(field_flag(f), dest=f.name, type=kind, choices=choices, metavar=metavar, default=None, help=text)


def _with_default(text: str, default) -> str:
  """'size (a, b)' -> 'size (a, b; default: X)'; 'steps' -> 'steps (default: X)'."""
  if default is None:
    return text
  return f"{text[:-1]}; default: {default})" if text.endswith(")") else f"{text} (default: {default})"


def _flag_type(annotation) -> type:
  """int for `int` and `int | None`, and so on."""
  import typing

  kinds = [t for t in typing.get_args(annotation) or (annotation,) if t is not type(None)]
  if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
    raise TypeError(f"no flag type for the annotation {annotation!r}")
  return kinds[0]


def _positive_float(value: str) -> float:
  try:
    number = float(value)
  except ValueError:
    number = float("nan")
  if not number > 0 or number == float("inf"):
    raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
  return number


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  return int(value) if value and value.strip().isdigit() else None


def start_distributed(args):
  """Starts jax.distributed when asked (flags, $JAX_COORDINATOR_ADDRESS or --distributed) with the watch over
  the other processes (s3r.train.run.peers); returns that watch, or None (one process). Must run before anything
  touches a JAX device."""
  from s3r.train.config import ConfigError

  if not (args.coordinator or args.distributed):
    if args.num_processes not in (None, 1) or args.process_id not in (None, 0):
      raise ConfigError("--num-processes/--process-id need --coordinator HOST:PORT (or --distributed)")
    return None
  from s3r.train.run import peers

  if args.coordinator:
    if args.num_processes is None or args.process_id is None:
      raise ConfigError(
        "--coordinator needs --num-processes and --process-id (or $JAX_NUM_PROCESSES and $JAX_PROCESS_ID)"
      )
    if not 0 <= args.process_id < args.num_processes:
      raise ConfigError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}")
  return peers.start(
    coordinator=args.coordinator,
    num_processes=args.num_processes,
    process_id=args.process_id,
    out=train_out(args),
    timeout_s=args.peer_timeout,
    factor=args.stall_factor,
    verbose=bool(args.verbose),
  )


def train_config(args, saved=None):
  """The TrainConfig of the flags; with --resume, `saved` (the run in --out, `s3r.train.run.resume.find_run`) with
  the given flags on top (the loop refuses changes other than RESUMABLE_CHANGES and a larger --steps). A bool
  flag (--resume, --no-progress) is this command's (or its --config file's, `config_file`), never the run's."""
  import dataclasses

  from s3r.train.config import TrainConfig

  fields = dataclasses.fields(TrainConfig)  # lr_changes is set only by --config (a run's own config.json)
  given = {f.name: getattr(args, f.name) for f in fields if getattr(args, f.name, None) is not None}
  switches = {f.name: given.get(f.name, f.default) for f in fields if isinstance(f.default, bool)}
  saved_fields = saved.config.to_dict() if saved else {}
  return TrainConfig.from_dict({**saved_fields, **given, **switches, "out": train_out(args)})


def train_out(args) -> str:
  """The run directory of `s3r train`: --out, else runs/<preset>-<recipe>."""
  from s3r.quant import DEFAULT_RECIPE

  return args.out or f"runs/{args.preset or 'cpu-small'}-{args.recipe or DEFAULT_RECIPE}"


def run_train(args) -> int:
  from s3r.train.loop import train
  from s3r.train.run import resume
  from s3r.train.run.guard import TrainingDiverged, TrainingInterrupted
  from s3r.train.run.placement import is_main_process

  if args.config is not None:
    from s3r.cli.config_file import apply_config_file

    apply_config_file(args, args.config)
  watch = start_distributed(args)
  try:
    saved = resume.find_run(train_out(args)) if args.resume else None
    cfg = train_config(args, saved)
    if saved is not None and args.mesh is None:
      cfg, note = resume.mesh_for_resume(cfg)
      if note and is_main_process():
        print(note)
    train(cfg, saved=saved)
  except (TrainingInterrupted, TrainingDiverged) as e:  # every process stops there together
    if watch is not None:
      watch.finished(EXIT_CODES["interrupted" if isinstance(e, TrainingInterrupted) else "diverged"])
    raise
  except BaseException as e:
    if watch is not None:
      watch.failed(e)  # a lost peer ends the process in there
    raise
  if watch is not None:
    watch.finished()
  return 0
