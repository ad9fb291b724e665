"""The `s3r` command line: train, eval, recipes, and sub-commands registered by other packages.

Each entry of COMMANDS names a sub-command and "module:function"; the function,
`register(subparsers)`, adds the sub-command's parser and sets `func` (args -> exit code
or None) as its default. Modules are imported only when needed: for `s3r NAME ...` just
NAME's module, for `s3r --help` all of them. To add a command (bench, sweep, diagnose),
add one line here.

Exit codes: 0 success; 1 training diverged; 2 bad flags, bad data or a bad run directory
(reported in one line, without a traceback).
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
    "bench": "s3r.bench.cli:register",
    "diagnose": "s3r.experiments.diagnose:register",
    "sweep": "s3r.experiments.sweep:register",
    "comm": "s3r.train.comm:register",
    "models": "s3r.model.listing:register",
}


class _Parser(argparse.ArgumentParser):
  """Reports a bad flag in one line (exit code 2)."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
  """Shows "(default: X)" except where the default is None or False (the help text says it)."""

  def _get_help_string(self, action):
    return action.help if action.default is None or action.default is False else super()._get_help_string(action)


def _fail(message: str, code: int = 2) -> int:
  print(f"s3r: error: {message}", file=sys.stderr)
  return code


def register_train(subparsers) -> None:
  import dataclasses

  from s3r.model import PRESETS
  from s3r.model.config import TP_PARTIAL_SUMS
  from s3r.quant import RECIPES
  from s3r.train.config import TrainConfig

  d = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # the one source of defaults
  p = subparsers.add_parser("train", help="train a language model with a quantization recipe",
                            description="Train a Llama-style model; writes metrics.jsonl, loss.png, config.json "
                                        "and checkpoints/ into --out.",
                            formatter_class=_Help)
  p.add_argument("--recipe", default=d["recipe"], choices=list(RECIPES), metavar="NAME",
                 help="quantization recipe of the block projections (see `s3r recipes`)")
  p.add_argument("--preset", default=d["preset"], choices=list(PRESETS), help="model size")
  p.add_argument("--steps", type=int, default=d["steps"], help="optimizer steps")
  p.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate (AdamW, cosine decay)")
  p.add_argument("--warmup", type=int, default=d["warmup"], help="linear warm-up steps")
  p.add_argument("--batch", type=int, default=d["batch"], help="sequences per step")
  p.add_argument("--seq", type=int, default=d["seq"], help="tokens per sequence")
  p.add_argument("--data", default=d["data"],
                 help="corpus: a file, directory or glob of .txt/.jsonl(.gz) files, or 'enwiki', 'shakespeare', "
                      "'python-stdlib' (default: enwiki from the shared data root)")
  p.add_argument("--vocab", type=int, default=d["vocab"], help="tokenizer vocabulary size")
  p.add_argument("--max-train-docs", type=int, default=d["max_train_docs"],
                 help="use only the first N training documents")
  p.add_argument("--out", default=None, help="run directory (default: runs/<preset>-<recipe>)")
  p.add_argument("--seed", type=int, default=d["seed"], help="seed of parameters, quantizer noise and batch order")
  p.add_argument("--eval-every", type=int, default=d["eval_every"],
                 help="validation loss every N steps (and at the end)")
  p.add_argument("--eval-batches", type=int, default=d["eval_batches"], help="batches per validation set")
  p.add_argument("--ckpt-every", type=int, default=d["ckpt_every"], help="checkpoint every N steps (and at the end)")
  p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
  p.add_argument("--mesh", default=d["mesh"],
                 help="device mesh over all devices of all processes, e.g. data=2,fsdp=2,tensor=2 (default: one "
                      "device); on CPU, simulate N devices with XLA_FLAGS=--xla_force_host_platform_device_count=N")
  p.add_argument("--tp-partial-sums", default=d["tp_partial_sums"], choices=TP_PARTIAL_SUMS,
                 help="under a tensor axis, the GEMM contracting the split dimension of a projection rounds each "
                      "shard's output to bf16 before the cross-shard sum (bf16, as the paper), or sums exact int32 "
                      "accumulators (int32: bitwise independent of the tensor-parallel degree)")
  g = p.add_argument_group("multi-process training (one process per host or GPU; see docs/scaling.md)")
  g.add_argument("--coordinator", default=os.environ.get("JAX_COORDINATOR_ADDRESS"), metavar="HOST:PORT",
                 help="address of process 0's coordination service (default: $JAX_COORDINATOR_ADDRESS); "
                      "starts jax.distributed with --num-processes and --process-id")
  g.add_argument("--num-processes", type=int, default=_env_int("JAX_NUM_PROCESSES"),
                 help="number of processes (default: $JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int, default=_env_int("JAX_PROCESS_ID"),
                 help="this process's index, 0 .. N-1 (default: $JAX_PROCESS_ID)")
  g.add_argument("--distributed", action="store_true",
                 help="start jax.distributed from the cluster environment (Slurm, Open MPI, TPU pods, Kubernetes) "
                      "without --coordinator")
  p.add_argument("--cache-dir", default=d["cache_dir"], help="tokenizer and token cache")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.set_defaults(func=run_train)


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
      raise ConfigError("--coordinator needs --num-processes and --process-id (or $JAX_NUM_PROCESSES and "
                        "$JAX_PROCESS_ID)")
    if not 0 <= args.process_id < args.num_processes:
      raise ConfigError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}")
    jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
  else:
    jax.distributed.initialize()
  return True


def run_train(args) -> int:
  from s3r.data import DataError
  from s3r.train.config import ConfigError, TrainConfig
  from s3r.train.loop import TrainingDiverged, train

  try:
    start_distributed(args)
    cfg = TrainConfig(
        out=args.out or f"runs/{args.preset}-{args.recipe}", preset=args.preset, recipe=args.recipe,
        steps=args.steps, lr=args.lr, warmup=args.warmup, batch=args.batch, seq=args.seq, data=args.data,
        vocab=args.vocab, max_train_docs=args.max_train_docs, cache_dir=args.cache_dir, seed=args.seed,
        eval_every=args.eval_every, eval_batches=args.eval_batches, ckpt_every=args.ckpt_every,
        resume=args.resume, mesh=args.mesh, tp_partial_sums=args.tp_partial_sums, progress=not args.no_progress)
    train(cfg)
  except (DataError, ConfigError) as e:
    return _fail(str(e))
  except TrainingDiverged as e:
    return _fail(str(e), code=1)
  return 0


def register_eval(subparsers) -> None:
  p = subparsers.add_parser("eval", help="validation loss and perplexity of a checkpoint",
                            description="Validation loss and perplexity of the latest checkpoint of a run.",
                            formatter_class=_Help)
  p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a run directory or its checkpoints/ folder")
  p.add_argument("--data", default=None,
                 help="corpus to evaluate on (default: the run's validation sets); other corpora are read whole "
                      "and encoded with the run's tokenizer")
  p.add_argument("--eval-batches", type=int, default=None, help="batches per validation set (default: the run's)")
  p.set_defaults(func=run_eval)


def run_eval(args) -> int:
  import math

  from s3r.data import DataError
  from s3r.train.config import ConfigError
  from s3r.train.loop import evaluate_checkpoint

  try:
    losses = evaluate_checkpoint(args.checkpoint_dir, data=args.data, max_batches=args.eval_batches)
  except (DataError, ConfigError) as e:
    return _fail(str(e))
  for name, loss in losses.items():
    print(f"{name}: loss {loss:.4f}, perplexity {math.exp(loss):.2f}")
  return 0


def register_recipes(subparsers) -> None:
  p = subparsers.add_parser("recipes", help="list the quantization recipes",
                            description="One line per registered recipe: name and description.")
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


if __name__ == "__main__":
  sys.exit(main())
