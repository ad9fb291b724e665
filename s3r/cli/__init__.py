"""The `s3r` command line: train, eval, models and recipes.

Each entry of COMMANDS names a sub-command and "module:function"; the function,
`register(subparsers)`, adds the sub-command's parser and sets `func` (args -> exit code
or None) as its default. Modules are imported only when needed: for `s3r NAME ...` just
NAME's module, for `s3r --help` all of them. To add a command, add one line here.
(The benchmarks and the paper's experiments run from a checkout: `python -m benchmarks`,
`python -m experiments`.)

Exit codes (EXIT_CODES; every error but a crash is one line on stderr, without a traceback):
  0    success
  1    training diverged (non-finite or blown-up loss, or a gradient norm of exactly 0)
  2    bad input: flags, data, run directory (including a run another training holds)
  3    resources: not enough memory for the train step, disk full
  130  interrupted (Ctrl-C / SIGTERM; `train` saves a checkpoint first)
  70   internal error (a bug: the traceback is printed)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS: dict[str, str] = {
  "train": "s3r.cli:register_train",
  "eval": "s3r.cli:register_eval",
  "recipes": "s3r.cli:register_recipes",
  "models": "s3r.cli.models:register",
}


class _Parser(argparse.ArgumentParser):
  """Reports a bad flag in one line (exit code 2)."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Shows "(default: X)" except where the default is None or False (the help text says it); keeps the
  paragraphs of the epilog (see `_paragraphs`)."""

  def _get_help_string(self, action):
    return action.help if action.default is None or action.default is False else super()._get_help_string(action)


EXIT_CODES = {"ok": 0, "diverged": 1, "bad_input": 2, "resources": 3, "interrupted": 130, "internal": 70}
EXIT_HELP = (
  "exit codes: 0 ok, 1 training diverged, 2 bad input (flags, data, run directory), 3 not enough "
  "memory or disk, 130 interrupted (a checkpoint is saved first), 70 internal error"
)


def _paragraphs(*texts: str) -> str:
  import textwrap

  return "\n\n".join(textwrap.fill(t, 100) for t in texts)


def _fail(message: str, code: int = 2) -> int:
  print(f"s3r: error: {message}", file=sys.stderr)
  return code


def _guarded(run, args) -> int:
  """Runs a command, turning expected failures into one line and an exit code (EXIT_CODES)."""
  from s3r.data import DataError
  from s3r.train.builder import ResourceError
  from s3r.train.config import ConfigError
  from s3r.train.guard import TrainingDiverged, TrainingInterrupted

  try:
    return run(args) or 0
  except (DataError, ConfigError) as e:
    return _fail(str(e), EXIT_CODES["bad_input"])
  except TrainingDiverged as e:
    return _fail(str(e), EXIT_CODES["diverged"])
  except ResourceError as e:
    return _fail(str(e), EXIT_CODES["resources"])
  except TrainingInterrupted as e:
    return _fail(f"interrupted: {e}", EXIT_CODES["interrupted"])
  except KeyboardInterrupt:
    return _fail("interrupted before training started; nothing was saved", EXIT_CODES["interrupted"])
  except MemoryError:
    return _fail("out of host memory; lower --batch or --seq, or use a smaller corpus", EXIT_CODES["resources"])
  except OSError as e:
    import errno

    code = EXIT_CODES["resources"] if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM) else EXIT_CODES["bad_input"]
    return _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e), code)
  except Exception as e:
    if "RESOURCE_EXHAUSTED" in str(e):
      first = next((line for line in str(e).splitlines() if "RESOURCE_EXHAUSTED" in line), str(e))[:300]
      return _fail(
        f"out of device memory ({first.strip()}); lower --batch or --seq, or add devices (--mesh)",
        EXIT_CODES["resources"],
      )
    import traceback

    traceback.print_exc()
    return _fail(f"internal error: {type(e).__name__}: {e}", EXIT_CODES["internal"])


# `s3r train` flags that set TrainConfig fields of the same name (dashes for underscores).
TRAIN_FIELDS = (
  "preset",
  "recipe",
  "steps",
  "lr",
  "warmup",
  "batch",
  "seq",
  "data",
  "vocab",
  "max_train_docs",
  "seed",
  "eval_every",
  "eval_batches",
  "ckpt_every",
  "mesh",
  "tp_partial_sums",
  "cache_dir",
)


def register_train(subparsers) -> None:
  import dataclasses

  from s3r.model import PRESETS
  from s3r.model.config import TP_PARTIAL_SUMS
  from s3r.quant import RECIPES
  from s3r.train.config import DEFAULT_WARMUP, MAX_LR, RESUMABLE_CHANGES, TrainConfig

  d = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # the one source of defaults
  presets = "; ".join(f"{name}: vocab {m.vocab_size}, seq {m.max_seq_len}" for name, m in PRESETS.items())
  changeable = ", ".join(
    f"--{k.replace('_', '-')}" for k in RESUMABLE_CHANGES if k not in ("out", "resume", "progress")
  )
  p = subparsers.add_parser(
    "train",
    help="train a language model with a quantization recipe",
    formatter_class=_Help,
    description=_paragraphs(
      "Train a decoder of any preset's family (Llama 3.1, Qwen3, Gemma 3, Qwen3-MoE, DeepSeek-V2; "
      "`s3r models` lists them); writes metrics.jsonl (from step 0), loss.png (with matplotlib), config.json "
      "and checkpoints/ into --out. Only one training may use an --out at a time."
    ),
    epilog=_paragraphs(
      f"Resume: `s3r train --out RUN --resume` continues RUN from its newest readable checkpoint with the run's "
      f"own settings (a damaged newest checkpoint is reported and the one before it used). With --resume only "
      f"{changeable} and --no-progress may change, --steps may be raised to extend the run: the cosine decay "
      f"is then stretched to the new total from the resumed step on (the learning rate moves to the stretched "
      f"curve's value at that step), and --lr may be lowered (recorded; e.g. after a divergence, which names the "
      f"checkpoint known to be good to continue from). Ctrl-C saves a checkpoint and stops; resume it the same way.",
      "Data: --data NAME is a path, else a folder of the data root: $S3R_DATA, else ../shared/data beside the "
      "repository (enwiki, shakespeare and c4 live there). python-stdlib (the running Python's standard "
      "library) needs no data and is the fallback corpus when there is no enwiki.",
      EXIT_HELP + ".",
    ),
  )
  p.add_argument(
    "--recipe",
    choices=list(RECIPES),
    metavar="NAME",
    help=f"quantization recipe of the block projections (see `s3r recipes`; default: {d['recipe']})",
  )
  p.add_argument("--preset", choices=list(PRESETS), help=f"model size ({presets}; default: {d['preset']})")
  p.add_argument(
    "--steps",
    type=int,
    help=f"optimizer steps in the whole run; with --resume, a larger value extends the run (default: {d['steps']})",
  )
  p.add_argument(
    "--lr", type=float, help=f"peak learning rate in (0, {MAX_LR:g}] (AdamW, cosine decay; default: {d['lr']})"
  )
  p.add_argument("--warmup", type=int, help=f"linear warm-up steps (default: min({DEFAULT_WARMUP}, steps // 10))")
  p.add_argument("--batch", type=int, help=f"sequences per step (default: {d['batch']})")
  p.add_argument("--seq", type=int, help="tokens per sequence (default: the preset's maximum sequence length)")
  p.add_argument(
    "--data",
    help="corpus: a file, directory or glob of .txt/.jsonl(.gz) files, or a name: enwiki, shakespeare "
    "(folders of the data root: $S3R_DATA, else ../shared/data beside the repository) or "
    "python-stdlib (needs no data) (default: enwiki if the data root has it, else python-stdlib)",
  )
  p.add_argument("--vocab", type=int, help="tokenizer vocabulary size (default: the preset's vocabulary)")
  p.add_argument("--max-train-docs", type=int, help="use only the first N training documents")
  p.add_argument("--out", default=None, help="run directory (default: runs/<preset>-<recipe>)")
  p.add_argument("--seed", type=int, help=f"seed of parameters, quantizer noise and batch order (default: {d['seed']})")
  p.add_argument(
    "--eval-every",
    type=int,
    help=f"validation loss every N steps (and at step 0 and the end; default: {d['eval_every']})",
  )
  p.add_argument("--eval-batches", type=int, help=f"batches per validation set (default: {d['eval_batches']})")
  p.add_argument(
    "--ckpt-every",
    type=int,
    help=f"checkpoint every N steps (and at the end and on Ctrl-C; default: {d['ckpt_every']})",
  )
  p.add_argument("--resume", action="store_true", help="continue the run in --out with its own settings (see below)")
  p.add_argument(
    "--mesh",
    help="device mesh over all devices of all processes: axes data, expert, fsdp, tensor, e.g. "
    "data=2,fsdp=2,tensor=2 or expert=4,data=2 (expert: MoE experts sharded; default: one "
    "device); on CPU, simulate N devices with XLA_FLAGS=--xla_force_host_platform_device_count=N",
  )
  p.add_argument(
    "--tp-partial-sums",
    choices=TP_PARTIAL_SUMS,
    help="under a tensor axis, the GEMM contracting the split dimension of a projection rounds each "
    "shard's output to bf16 before the cross-shard sum (bf16, as the paper), or sums exact int32 "
    f"accumulators (int32: bitwise independent of the tensor-parallel degree; default: "
    f"{d['tp_partial_sums']})",
  )
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
  p.add_argument("--cache-dir", help=f"tokenizer and token cache (default: {d['cache_dir']})")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.add_argument(
    "--verbose", action="store_true", help="library logs (Orbax, JAX) on the console too (always in --out/train.log)"
  )
  p.set_defaults(func=lambda args: _guarded(run_train, args))


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  return int(value) if value and value.strip().isdigit() else None


def start_distributed(args) -> bool:
  """Starts jax.distributed when asked (flags, $JAX_COORDINATOR_ADDRESS or --distributed);
  returns whether it did. Must run before anything touches a JAX device."""
  from s3r.train.config import ConfigError

  if not (args.coordinator or args.distributed):
    if args.num_processes not in (None, 1) or args.process_id not in (None, 0):
      raise ConfigError("--num-processes/--process-id need --coordinator HOST:PORT (or --distributed)")
    return False
  import jax

  if args.coordinator:
    if args.num_processes is None or args.process_id is None:
      raise ConfigError(
        "--coordinator needs --num-processes and --process-id (or $JAX_NUM_PROCESSES and $JAX_PROCESS_ID)"
      )
    if not 0 <= args.process_id < args.num_processes:
      raise ConfigError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}")
    jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
  else:
    jax.distributed.initialize()
  return True


def train_config(args):
  """The TrainConfig of the flags; with --resume, the run's saved config with the given flags on top
  (the loop refuses changes other than RESUMABLE_CHANGES and a larger --steps)."""
  from s3r.quant import DEFAULT_RECIPE
  from s3r.train.config import TrainConfig

  given = {k: getattr(args, k) for k in TRAIN_FIELDS if getattr(args, k) is not None}
  out = args.out or f"runs/{given.get('preset', 'cpu-small')}-{given.get('recipe', DEFAULT_RECIPE)}"
  saved = saved_train_config(out) if args.resume else None
  fields = {
    **(saved or {}),
    **given,
    "out": out,
    "resume": args.resume,
    "progress": not args.no_progress,
    "verbose": args.verbose,
  }
  return TrainConfig.from_dict(fields)


def saved_train_config(out: str) -> dict | None:
  """The run config saved in run directory `out`: from its newest readable checkpoint, else its config.json;
  None if it has neither."""
  import json
  import pathlib

  from s3r.train import checkpoint
  from s3r.train.config import ConfigError
  from s3r.train.evaluate import open_run

  if (pathlib.Path(out) / checkpoint.CHECKPOINT_DIR).is_dir():
    try:
      ckpt, cfg, _ = open_run(out, log=lambda *_: None)
      ckpt.close()
      return cfg.to_dict()
    except ConfigError:
      pass
  try:
    return json.loads((pathlib.Path(out) / "config.json").read_text())["train"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def run_train(args) -> int:
  from s3r.train.loop import train

  start_distributed(args)
  train(train_config(args))
  return 0


def register_eval(subparsers) -> None:
  p = subparsers.add_parser(
    "eval",
    help="validation loss and perplexity of a checkpoint",
    formatter_class=_Help,
    description=_paragraphs(
      "Validation loss and perplexity of the newest readable checkpoint of a run (a "
      "damaged newest checkpoint is reported and the one before it used)."
    ),
    epilog=_paragraphs(EXIT_HELP + "."),
  )
  p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a run directory or its checkpoints/ folder")
  p.add_argument(
    "--data",
    default=None,
    help="corpus to evaluate on, named as for `s3r train --data` (default: the run's validation sets); "
    "another corpus is read whole and encoded with the run's tokenizer, with a warning when it "
    "holds training documents of the run",
  )
  p.add_argument("--eval-batches", type=int, default=None, help="batches per validation set (default: the run's)")
  p.set_defaults(func=lambda args: _guarded(run_eval, args))


def run_eval(args) -> int:
  import math

  from s3r.train.config import ConfigError
  from s3r.train.evaluate import evaluate_checkpoint

  if args.eval_batches is not None and args.eval_batches < 1:
    raise ConfigError(f"--eval-batches must be an integer >= 1, got {args.eval_batches}")
  losses = evaluate_checkpoint(args.checkpoint_dir, data=args.data, max_batches=args.eval_batches)
  for name, loss in losses.items():
    print(f"{name}: loss {loss:.4f}, perplexity {math.exp(loss):.2f}")
  return 0


def register_recipes(subparsers) -> None:
  p = subparsers.add_parser(
    "recipes", help="list the quantization recipes", description="One line per registered recipe: name and description."
  )
  p.set_defaults(func=run_recipes)


def run_recipes(args) -> int:
  from s3r.quant import RECIPES

  width = max(map(len, RECIPES))
  for name, r in RECIPES.items():
    print(f"{name:<{width}}  {r.description}")
  return 0


def _register(subparsers, name: str) -> None:
  """Adds command `name`; one whose module fails to import is listed and reports why when run."""
  module, function = COMMANDS[name].split(":")
  try:
    getattr(importlib.import_module(module), function)(subparsers)
  except ImportError as e:
    why = f"{name} is unavailable: {e}"
    parser = subparsers.choices.get(name) or subparsers.add_parser(name, help=f"(unavailable: {e})")
    parser.set_defaults(func=lambda args: _fail(why))


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
  """The parser; with a known command first in `argv`, only that command's module is imported."""
  parser = _Parser(prog="s3r", description="Fast, unbiased INT8 quantized training (S3R, S3R-EC).")
  subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
  subparsers.required = True
  for name in [argv[0]] if argv and argv[0] in COMMANDS else COMMANDS:
    _register(subparsers, name)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser(argv).parse_args(argv)
  return args.func(args) or 0
