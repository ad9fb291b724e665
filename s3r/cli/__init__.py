"""The `s3r` command line: train, eval, generate, export, models and recipes.

Each entry of COMMANDS names a sub-command and "module:function"; the function,
`register(subparsers)`, adds the sub-command's parser and sets `func` (args -> exit code
or None) as its default. Modules are imported only when needed: for `s3r NAME ...` just
NAME's module, for `s3r --help` all of them. Each command has a module of its own (`train.py`,
`evaluate.py`, `generate.py`, `recipes.py`, `models.py`, `export.py`); to add a command, add its
module and one line here.
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
       every process completed (s3r.train.run.peers)
  70   internal error (a bug: the traceback is printed)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from s3r.cli.common import EXIT_CODES, Parser, fail  # EXIT_CODES: documented above

COMMANDS: dict[str, str] = {
  "train": "s3r.cli.train:register",
  "eval": "s3r.cli.evaluate:register",
  "generate": "s3r.cli.generate:register",
  "recipes": "s3r.cli.recipes:register",
  "models": "s3r.cli.models:register",
  "export": "s3r.cli.export:register",
}


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
