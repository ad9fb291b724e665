"""The `s3r` command line: train, eval, generate, export, models and recipes.

Each entry of COMMANDS names a sub-command and "module:function"; the function,
`register(subparsers)`, adds the sub-command's parser and sets `func` (args -> exit code
or None) as its default. Modules are imported only when needed: for `s3r NAME ...` just
NAME's module, for `s3r --help` all of them. To add a command, add one line here.
(The benchmarks and the paper's experiments run from a checkout: `python -m benchmarks`,
`python -m research`.)

Exit codes (EXIT_CODES; every error but a crash is one line on stderr, without a traceback):
  0    success
  1    training diverged (non-finite or blown-up loss, or a gradient norm of exactly 0)
  2    bad input: flags, data, run directory (including a run another training holds), a Hugging Face
       checkpoint that cannot be imported
  3    resources: not enough memory for the train step, disk full
  130  interrupted (Ctrl-C / SIGTERM; `train` saves a checkpoint first; with several processes, a signal to
       any of them stops all of them at one step)
  75   a process of a multi-process run was lost or stuck; the others stopped, naming the last checkpoint
       every process completed (s3r.train.peers)
  70   internal error (a bug: the traceback is printed)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from s3r.cli.common import EXIT_CODES, EXIT_HELP, HelpFormatter, Parser, fail, guarded, paragraphs, recipe_name

COMMANDS: dict[str, str] = {
  "train": "s3r.cli:register_train",
  "eval": "s3r.cli:register_eval",
  "generate": "s3r.cli.generate:register",
  "recipes": "s3r.cli:register_recipes",
  "models": "s3r.cli.models:register",
  "export": "s3r.cli.export:register",
}


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


def register_train(subparsers) -> None:
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
    meta, kind = f.metadata, _flag_type(hints[f.name])
    plain = f.default not in (None, dataclasses.MISSING) and kind is not bool
    shown = meta.get("default_help") or (f.default if plain else None)
    text = _with_default(meta.get("help") or f.name.replace("_", " "), shown)
    if kind is bool:
      action = "store_false" if f.default is True else "store_true"
      p.add_argument(field_flag(f), dest=f.name, action=action, default=None, help=text)
    else:
      choices, metavar, parse = meta.get("choices"), meta.get("metavar"), _FLAG_PARSERS.get(f.name, kind)
      p.add_argument(field_flag(f), dest=f.name, type=parse, choices=choices, metavar=metavar, default=None, help=text)


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
  the other processes (s3r.train.peers); returns that watch, or None (one process). Must run before anything
  touches a JAX device."""
  from s3r.train.config import ConfigError

  if not (args.coordinator or args.distributed):
    if args.num_processes not in (None, 1) or args.process_id not in (None, 0):
      raise ConfigError("--num-processes/--process-id need --coordinator HOST:PORT (or --distributed)")
    return None
  from s3r.train import peers

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
  """The TrainConfig of the flags; with --resume, `saved` (the run in --out, `s3r.train.resume.find_run`) with
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
  from s3r.train import resume
  from s3r.train.guard import TrainingDiverged, TrainingInterrupted
  from s3r.train.loop import train
  from s3r.train.placement import is_main_process

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


def register_eval(subparsers) -> None:
  from s3r.model.config import ACT_DTYPES

  p = subparsers.add_parser(
    "eval",
    help="validation loss and perplexity of a checkpoint",
    formatter_class=HelpFormatter,
    description=paragraphs(
      "Validation loss and perplexity of the newest readable checkpoint of a run (a "
      "damaged newest checkpoint is reported and the one before it used), or of the checkpoint of one "
      "step: `s3r eval RUN/checkpoints/25` or `s3r eval RUN --step 25`. `s3r eval --init-from HF_DIR --data "
      "PATH` evaluates a Hugging Face checkpoint on the validation documents `s3r train --init-from HF_DIR "
      "--data PATH` holds out (with the same --batch, --seq and --eval-batches: that run's step-0 numbers). "
      "Activations are bfloat16, as training evaluates (so the numbers are the run's own); --dtype float32 "
      "evaluates them in full precision."
    ),
    epilog=paragraphs(EXIT_HELP + "."),
  )
  p.add_argument(
    "checkpoint_dir",
    metavar="CHECKPOINT_DIR",
    nargs="?",
    help="a run directory, its checkpoints/ folder, or one checkpoint's folder (RUN/checkpoints/25)",
  )
  g = p.add_argument_group("a Hugging Face checkpoint instead of a run")
  g.add_argument("--init-from", metavar="HF_DIR", help="the checkpoint folder (config.json, safetensors, tokenizer)")
  g.add_argument("--init-layers", type=int, metavar="N", help="keep only the first N decoder layers")
  g.add_argument("--batch", type=int, help="sequences per batch (default: as s3r train)")
  g.add_argument("--seq", type=int, help="tokens per sequence (default: as s3r train)")
  p.add_argument(
    "--step",
    type=int,
    default=None,
    help="the step whose checkpoint to evaluate (default: the newest readable); a missing step is an error "
    "that lists the steps there are",
  )
  p.add_argument(
    "--data",
    default=None,
    help="corpus to evaluate on, named as for `s3r train --data` (default: the run's validation sets); "
    "another corpus is read whole and encoded with the run's tokenizer, with a warning when it "
    "holds training documents of the run",
  )
  p.add_argument("--eval-batches", type=int, default=None, help="batches per validation set (default: the run's)")
  p.add_argument(
    "--cache-dir",
    default=None,
    help="tokenizer and token cache, as for `s3r train --cache-dir` (default: the run's; .cache/s3r with --init-from)",
  )
  p.add_argument(
    "--dtype",
    choices=ACT_DTYPES,
    default="bfloat16",
    help="activation dtype; bfloat16 as training evaluates (the run's own numbers), float32 for full precision",
  )
  p.set_defaults(func=lambda args: guarded(run_eval, args))


def run_eval(args) -> int:
  import math

  from s3r.train.config import ConfigError
  from s3r.train.evaluate import evaluate_checkpoint, evaluate_pretrained

  if args.eval_batches is not None and args.eval_batches < 1:
    raise ConfigError(f"--eval-batches must be an integer >= 1, got {args.eval_batches}")
  if args.step is not None and args.step < 0:
    raise ConfigError(f"--step must be an integer >= 0, got {args.step}")
  if (args.checkpoint_dir is None) == (args.init_from is None):
    raise ConfigError("give a run (CHECKPOINT_DIR) or --init-from HF_DIR, not both")
  if args.cache_dir is not None and os.path.exists(args.cache_dir) and not os.path.isdir(args.cache_dir):
    raise ConfigError(f"--cache-dir {args.cache_dir} is an existing file, not a directory")
  if args.init_from is None:
    given = [f"--{k.replace('_', '-')}" for k in ("init_layers", "batch", "seq") if getattr(args, k) is not None]
    if given:
      raise ConfigError(f"{', '.join(given)}: only with --init-from (a run evaluates with its own)")
    losses = evaluate_checkpoint(
      args.checkpoint_dir,
      step=args.step,
      data=args.data,
      max_batches=args.eval_batches,
      act_dtype=args.dtype,
      cache_dir=args.cache_dir,
    )
  else:
    if args.step is not None:
      raise ConfigError("--step: only with a run (CHECKPOINT_DIR)")
    fields = {
      "init_layers": args.init_layers,
      "batch": args.batch,
      "seq": args.seq,
      "eval_batches": args.eval_batches,
      "cache_dir": args.cache_dir,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    losses = evaluate_pretrained(args.init_from, data=args.data, act_dtype=args.dtype, **given)
  for name, loss in losses.items():
    print(f"{name}: loss {loss:.4f}, perplexity {math.exp(loss):.2f}")
  return 0


# Fields whose flag values are checked by a parser of their own (a one-line error at parse time) instead of
# `choices`: a recipe is a registered name or NAME@FORMAT, too many to list.
_FLAG_PARSERS = {"recipe": recipe_name}


def register_recipes(subparsers) -> None:
  p = subparsers.add_parser(
    "recipes",
    help="list the quantization recipes and gradient formats",
    description="One line per registered recipe (name and description), then the gradient formats: "
    "NAME@FORMAT is recipe NAME with its backward's gradient codes in FORMAT, NAME+fwd_FORMAT with its forward's "
    "codes in FORMAT.",
  )
  p.set_defaults(func=run_recipes)


def run_recipes(args) -> int:
  from s3r.quant import RECIPES
  from s3r.quant.formats import FORMATS, FORWARD_FORMATS

  width = max(map(len, RECIPES))
  for name, r in RECIPES.items():
    print(f"{name:<{width}}  {r.description}")
  print(
    f"gradient formats (NAME@FORMAT, every recipe but bf16 and int8_exact_bwd): {', '.join(FORMATS)} (default int8)"
  )
  print(
    f"forward formats (NAME+fwd_FORMAT or NAME@FORMAT+fwd_FORMAT, every recipe but bf16): "
    f"{', '.join(FORWARD_FORMATS)} (default int8; e.g. the all-FP8 s3r_ec_dx@e5m2+fwd_e4m3)"
  )
  return 0


def _register(subparsers, name: str) -> None:
  """Adds command `name`; one whose module fails to import is listed and reports why when run."""
  module, function = COMMANDS[name].split(":")
  try:
    getattr(importlib.import_module(module), function)(subparsers)
  except ImportError as e:
    why = f"{name} is unavailable: {e}"
    parser = subparsers.choices.get(name) or subparsers.add_parser(name, help=f"(unavailable: {e})")
    parser.set_defaults(func=lambda args: fail(why))


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
  """The parser; with a known command first in `argv`, only that command's module is imported."""
  parser = Parser(prog="s3r", description="Unbiased INT8 quantized training (S3R, S3R-EC).")
  subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
  subparsers.required = True
  for name in [argv[0]] if argv and argv[0] in COMMANDS else COMMANDS:
    _register(subparsers, name)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--verbose" not in argv:
    # XLA's C++ warnings (an allocation that failed before s3r reports it in one line, say) reach
    # stderr directly, not through Python logging: keep them out unless asked for. Set before JAX loads.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  args = build_parser(argv).parse_args(argv)
  return args.func(args) or 0
