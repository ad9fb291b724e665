"""The `s3r bench` command: `register(subparsers)` adds it to the main CLI's subparsers.

Sub-commands: ffn, quantizer, static, peers, step. Each module defines `add_arguments(parser)`
and `run(args)`; they are imported lazily so that `s3r --help` does not import JAX.
"""

from __future__ import annotations

import argparse
import importlib

_COMMANDS = {
    "ffn": ("s3r.bench.ffn", "time one SwiGLU FFN block fwd+bwd per recipe at the paper's shapes (Table III)"),
    "quantizer": ("s3r.bench.quantizer", "time the backward gradient quantizer alone against a memory-bound floor"),
    "static": ("s3r.bench.static", "static costs from the compiled HLO and jaxpr: ops/element, random words, bytes, temp memory"),
    "peers": ("s3r.bench.peers", "compare with AQT and Qwix (optional extra s3r[peers]): time and gradient error"),
    "step": ("s3r.bench.step", "time full training steps of the cpu-small model per recipe"),
}


def _module(name: str):
  return importlib.import_module(_COMMANDS[name][0])


def _run(args: argparse.Namespace):
  return _module(args.bench_command).run(args)


def register(subparsers) -> argparse.ArgumentParser:
  """Adds `bench` (with ffn, quantizer, static, peers, step) to an argparse subparsers object."""
  bench = subparsers.add_parser("bench", help="benchmarks (results go to results/bench_*)",
                                description="Benchmarks of the quantized layer, its quantizer and training steps. "
                                            "Results: results/bench_<name>_<platform>.{json,md,png}.")
  sub = bench.add_subparsers(dest="bench_command", metavar="{" + ",".join(_COMMANDS) + "}")
  sub.required = True
  for name, (modname, help_) in _COMMANDS.items():
    mod = importlib.import_module(modname)
    p = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(p)
    p.set_defaults(func=_run, bench_command=name)
  return bench


def build_parser() -> argparse.ArgumentParser:
  """A stand-alone parser whose only command is `bench` (used by `python -m s3r.bench`)."""
  parser = argparse.ArgumentParser(prog="python -m s3r.bench", description="s3r benchmarks")
  sub = parser.add_subparsers(dest="command")
  sub.required = True
  register(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  import sys
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] != "bench":
    argv = ["bench", *argv]
  args = build_parser().parse_args(argv)
  args.func(args)
  return 0
