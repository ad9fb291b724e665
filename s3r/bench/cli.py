"""The `s3r bench` command: `register(subparsers)` adds it to the main CLI's subparsers.

Sub-commands: matmul, ffn, moe, quantizer, static, peers, step, profile, merge. Each module defines
`add_arguments(parser)` and `run(args)`; they import JAX-heavy code (models, peers) only when a benchmark runs.
`python -m s3r.bench ffn ...` runs the same sub-commands without the main CLI.
"""

from __future__ import annotations

import argparse
import importlib

COMMANDS = {
  "matmul": ("s3r.bench.matmul", "time one quantized linear layer fwd+bwd per recipe (x[T,K] @ w[K,N])"),
  "ffn": ("s3r.bench.ffn", "time one SwiGLU FFN block fwd+bwd per recipe at the paper's shapes (Table III)"),
  "moe": ("s3r.bench.moe", "time the MoE feed-forward block fwd+bwd per recipe and the grouped GEMM formulations"),
  "quantizer": ("s3r.bench.quantizer", "time the backward gradient quantizer alone against a memory-bound floor"),
  "static": (
    "s3r.bench.static",
    "static costs from the compiled HLO and jaxpr: ops/element, random words, bytes, temp memory",
  ),
  "peers": ("s3r.bench.peers", "compare with AQT and Qwix (optional extra s3r[peers]): time and gradient error"),
  "step": ("s3r.bench.step", "time full training steps of a model preset (default cpu-small) per recipe"),
  "profile": ("s3r.bench.profile", "per-fusion CPU time of the FFN block fwd+bwd (jax.profiler + compiled HLO)"),
  "merge": ("s3r.bench.merge", "join ffn or quantizer results files that cover different shapes into one"),
}


def _run(args: argparse.Namespace) -> int:
  importlib.import_module(COMMANDS[args.bench_command][0]).run(args)
  return 0


def add_commands(sub) -> None:
  """Adds the benchmark sub-commands to an argparse subparsers object."""
  for name, (modname, help_) in COMMANDS.items():
    mod = importlib.import_module(modname)
    p = sub.add_parser(
      name, help=help_, description=(mod.__doc__ or help_).strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mod.add_arguments(p)
    p.set_defaults(func=_run, bench_command=name)


def register(subparsers) -> argparse.ArgumentParser:
  """Adds `bench` (matmul, ffn, moe, quantizer, static, peers, step, profile, merge) to the CLI's subparsers."""
  bench = subparsers.add_parser(
    "bench",
    help="benchmarks (results go to results/bench_*)",
    description="Benchmarks of the quantized layer, its quantizer and training steps. "
    "Results: results/bench_<name>_<platform>.{json,md,png}.",
  )
  sub = bench.add_subparsers(dest="bench_command", metavar="{" + ",".join(COMMANDS) + "}")
  sub.required = True
  add_commands(sub)
  return bench


def build_parser() -> argparse.ArgumentParser:
  """The stand-alone parser of `python -m s3r.bench`."""
  parser = argparse.ArgumentParser(
    prog="python -m s3r.bench",
    description="s3r benchmarks (same as `s3r bench ...`). Results: results/bench_<name>_<platform>.{json,md,png}.",
  )
  sub = parser.add_subparsers(dest="bench_command", metavar="{" + ",".join(COMMANDS) + "}")
  sub.required = True
  add_commands(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  import sys

  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["bench"]:  # `python -m s3r.bench bench ffn` works too
    argv = argv[1:]
  args = build_parser().parse_args(argv)
  return args.func(args) or 0
