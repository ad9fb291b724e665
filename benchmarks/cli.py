"""`python -m benchmarks NAME ...`: the benchmarks, run from a checkout of the repository.

Sub-commands: matmul, ffn, moe, quantizer, static, peers, step, scan, profile, merge, comm, hf_load, eqx,
gemm_sweep, calibrate, aot, perfmodel, heapplot, maxtext. Each module defines `add_arguments(parser)` and
`run(args)`; they import JAX-heavy code (models, peers) only when a benchmark runs. The benchmarks import the `s3r`
library; the library never imports them.
"""

from __future__ import annotations

import argparse
import importlib

COMMANDS = {
  "matmul": ("benchmarks.matmul", "time one quantized linear layer fwd+bwd per recipe (x[T,K] @ w[K,N])"),
  "ffn": ("benchmarks.ffn", "time one SwiGLU FFN block fwd+bwd per recipe at the paper's shapes (Table III)"),
  "moe": ("benchmarks.moe", "time the MoE feed-forward block fwd+bwd per recipe and the grouped GEMM formulations"),
  "quantizer": ("benchmarks.quantizer", "time the backward gradient quantizer alone against a memory-bound floor"),
  "static": (
    "benchmarks.static",
    "static costs from the compiled HLO and jaxpr: ops/element, random words, bytes, temp memory",
  ),
  "peers": ("benchmarks.peers", "compare with AQT and Qwix (optional extra s3r[peers]): time and gradient error"),
  "step": ("benchmarks.step", "time full training steps of a model preset (default cpu-small) per recipe"),
  "scan": ("benchmarks.scan", "the scanned decoder vs the unrolled loop: train-step compile time per depth, step time"),
  "profile": ("benchmarks.profile", "per-fusion CPU time of the FFN block fwd+bwd (jax.profiler + compiled HLO)"),
  "merge": ("benchmarks.merge", "join ffn or quantizer results files that cover different shapes into one"),
  "comm": ("benchmarks.comm", "bytes moved by collectives in one compiled train step, per recipe"),
  "hf_load": ("benchmarks.hf_load", "time and peak host memory of loading a Hugging Face checkpoint (load_hf)"),
  "eqx": (
    "benchmarks.eqx",
    "time training steps of an Equinox model applied per example (quantize_fn vs qmatmul+vmap)",
  ),
  "gemm_sweep": (
    "benchmarks.gemm_sweep",
    "the FFN's forward, dX and dW GEMMs alone per operand type (bf16, s8, FP8): time and XLA's GEMM backend",
  ),
  "calibrate": (
    "benchmarks.calibrate",
    "per-kernel device times of the FFN block and a sliced train step from profiler traces (GPU calibration)",
  ),
  "aot": (
    "benchmarks.aot",
    "compile the FFN, MoE and train-step programs for an H100/H200 on this CPU (extra gpu-aot): seconds, memory, GEMMs",
  ),
  "perfmodel": (
    "benchmarks.perfmodel_cli",
    "predicted step time on an H100, H200 or TPU v5p from the compiled HLO (a model fitted on measurements)",
  ),
  "heapplot": (
    "benchmarks.heapplot",
    "draw a program's temp allocation over offset and program step from an `aot --breakdown` results file",
  ),
  "maxtext": (
    "benchmarks.maxtext",
    "s3r's MaxText backend vs MaxText's int8 (AQT) and bf16 on a tiny model: step time and loss (needs maxtext)",
  ),
}
PROG = "python -m benchmarks"


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


def build_parser() -> argparse.ArgumentParser:
  """The stand-alone parser of `python -m benchmarks`."""
  parser = argparse.ArgumentParser(
    prog=PROG,
    description="s3r benchmarks. Results: bench_<name>_<platform>.{json,md,png} in each command's --out-dir.",
  )
  sub = parser.add_subparsers(dest="bench_command", metavar="{" + ",".join(COMMANDS) + "}")
  sub.required = True
  add_commands(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  import sys

  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser().parse_args(argv)
  return args.func(args) or 0
