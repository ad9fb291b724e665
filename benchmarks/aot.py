"""`python -m benchmarks aot`: programs compiled for a GPU or a TPU on this machine, neither needed ("deviceless").

XLA's GPU compiler runs on a CPU-only machine when it is given a description of the target GPU. The
descriptions of the H100 (SXM, 80 GB) and the H200 are in `benchmarks/targets/` (XLA's published
`GpuTargetConfigProto` text, see each file's header); `jax.experimental.topologies.get_topology_desc`
turns one into compile-only devices, the programs are lowered from abstract arguments
(`jax.ShapeDtypeStruct` with shardings on those devices, the PRNG key included) and compiled. Needs
the optional extra `gpu-aot` (the CUDA plugin of the pinned JAX, about 4.3 GB; no driver, no GPU):
`pip install -e '.[gpu-aot]' -c constraints.txt`. The command sets `JAX_PLATFORMS=cpu` for itself.
The TPU target `v5p` is a topology of libtpu's compile-only TPU v5p devices (`get_topology_desc("v5p:2x2x1",
"tpu")`, one chip used); it needs the optional extra `tpu-aot` (libtpu at the pinned JAX, no TPU), in an
environment of its own: `pip install -e '.[tpu-aot]' -c constraints.txt`. No XLA:GPU option is passed to
a TPU compile, and the GEMM census reads TPU HLO (`aot_report.tpu_gemm_kinds`).

Programs (`--program`, comma-separated):
Recipes (`--recipes`): registered names, also at a gradient format and with the E4M3 forward
(`s3r_ec_dx@e5m2`, `s3r_ec_dx@e5m2+fwd_e4m3`); the report counts the native FP8 GEMMs of each program
(`aot_report.fp8_gemms`: FP8 operands in cuBLASLt's FP8 matmul or a Triton GEMM).
- ffn: the SwiGLU FFN block forward + backward of `python -m benchmarks ffn` (x [T, H] bf16, f32
  weights) at `--shapes` and `--tokens`;
- moe: one `s3r.grouped_qmatmul` forward + backward (x [T, K], w [E, K, N], E equal groups) with the
  grouped GEMM `--moe-impl` (auto: the Pallas kernels on CUDA, which are given the target's compute
  capability through the abstract mesh of the target devices);
- step: the train step of `s3r train` (`s3r.train.builder.build`: model, AdamW, shardings, donated
  state) of `--preset` at each of `--layers`, `--batch` x `--seq`, `--remat`, `--attention`, in each
  decoder layout of `--layout` (scan: the blocks under one `jax.lax.scan`, the default; unrolled: a Python
  loop, `scan_layers=False`);
- lockstep: the train step that `scripts/device_quality.sh` runs (`research.lockstep`: the preset's
  own remat, the learning rate as an argument, `--schedule-steps`) at `--preset`, `--layers`, `--batch`
  x `--seq`, `--attention`, `--layout`.

Per program and recipe: trace + lowering seconds, XLA compile seconds (wall clock and CPU), `memory_analysis()` (temp,
argument, output, alias bytes), the GEMMs of the optimized HLO by kind (Triton GEMM fusions with
their operand types, cuBLAS / cuBLASLt custom calls, cuDNN attention, Pallas Triton kernels), fusion
and instruction counts; with `--breakdown`, the buffers live at the memory peak (`labtools.analysis.memory`,
a second compile with XLA's dump on). Compile options: `--xla NAME=VALUE` (repeatable), passed to XLA
per compile; `xla_gpu_autotune_level=0` unless given (there is no GPU to autotune on). The programs
are compiled one at a time, so the seconds are of one compile on this machine (they vary with load; the CPU
seconds of the compile, this process's threads and the ptxas processes XLA starts, vary less). The first
compile of a process also pays one-time costs (loading XLA:GPU's libraries and compilers); `--warmup`
compiles the first program once before anything is measured.
With several `--layers`, the report adds each recipe's lower + compile seconds (wall and CPU) at the
shallowest and the deepest depth and their ratio, per layout (the scanned decoder's target: at most 1.25).
Results: `<out-dir>/bench_aot_<target>[_<tag>]_cpu.{json,md}` (cpu: the machine that compiled).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import pathlib
import re
from collections.abc import Callable
from typing import Any

from benchmarks import aot_report, options
from benchmarks.aot_compile import (  # noqa: F401 - re-exported: part of this command's interface
  DEFAULT_COMPILER_OPTIONS,
  XLA_TIMER_MODULES,
  compiler_options,
  cpu_seconds,
  measure,
  stderr_captured,
  target_mesh,
  use_cpu_host,
)
from benchmarks.aot_programs import lower_ffn, lower_lockstep, lower_moe, lower_step
from benchmarks.aot_targets import (  # noqa: F401 - re-exported: the targets are part of this command's interface
  MISSING_EXTRA,
  MISSING_TPU_EXTRA,
  PLUGINS,
  TARGETS,
  TARGETS_DIR,
  TPU_TARGETS,
  cuda_plugin_installed,
  is_tpu,
  target_devices,
  target_spec,
  tpu_plugin_installed,
)
from labtools import executables
from labtools.results import RESULTS_DIR, Run, loadavg, log, parse_list

PROGRAMS = ("ffn", "moe", "step", "lockstep")
LAYOUTS = {"scan": True, "unrolled": False}  # --layout: scan_layers of the step and lockstep programs
# --- command -----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--target",
    default="h100",
    help=f"{', '.join([*TARGETS, *TPU_TARGETS])} or a GpuTargetConfigProto file (default %(default)s)",
  )
  p.add_argument("--program", default="ffn", help=f"comma-separated, of {', '.join(PROGRAMS)} (default %(default)s)")
  p.add_argument(
    "--recipes", default=",".join(options.BENCH_RECIPES), help="comma-separated recipes (default %(default)s)"
  )
  p.add_argument("--xla", action="append", metavar="NAME=VALUE", help="an XLA option for every compile (repeatable)")
  p.add_argument("--breakdown", action="store_true", help="also the buffers live at the memory peak (compiles twice)")
  p.add_argument(
    "--warmup",
    action="store_true",
    help="compile the first program once, unmeasured, so that no measured compile pays the process's one-time costs",
  )
  p.add_argument(
    "--xla-timers",
    action="store_true",
    help="also XLA's own timers of the compile: each HLO pass, the backend, LLVM-to-PTX and ptxas (from its logs)",
  )
  g = p.add_argument_group("ffn")
  g.add_argument("--shapes", default="W1,W3", help="FFN shapes W1..W9 or HxD (default %(default)s)")
  g.add_argument("--tokens", type=int, default=16384, help="tokens T of the FFN and MoE programs (default %(default)s)")
  g = p.add_argument_group("moe")
  g.add_argument("--moe-shape", default="2048x768x64", help="KxNxE of the grouped GEMM (default %(default)s)")
  g.add_argument("--moe-tokens", type=int, default=8192, help="rows T of the grouped GEMM (default %(default)s)")
  g.add_argument(
    "--moe-impl",
    default="auto",
    help="comma-separated grouped GEMMs: auto, pallas, ragged, tiled (default %(default)s)",
  )
  g = p.add_argument_group("step")
  g.add_argument("--preset", default="paper-12l", help="model preset (default %(default)s)")
  g.add_argument("--layers", default="1", help="comma-separated depths (default %(default)s)")
  g.add_argument(
    "--layout", default="scan", help=f"comma-separated decoder layouts, of {', '.join(LAYOUTS)} (default %(default)s)"
  )
  g.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
  g.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default %(default)s)")
  g.add_argument(
    "--grad-accum",
    default="1",
    metavar="N[,N...]",
    help="step: microbatches per step, comma-separated, each compiled (s3r train --grad-accum; --batch stays the "
    "global batch; default %(default)s)",
  )
  g.add_argument("--remat", choices=("none", "full"), default="full", help="rematerialize blocks (default %(default)s)")
  g.add_argument(
    "--attention",
    choices=("auto", "xla", "cudnn"),
    default="auto",
    help="attention kernel: auto (cuDNN where it compiles for the target, else XLA), xla, cudnn (default %(default)s)",
  )
  g.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
  g.add_argument("--width", type=int, default=None, help="model width override, for tests (default: the preset's)")
  g.add_argument("--seed", type=int, default=0, help="seed of the configuration (default %(default)s)")
  g.add_argument(
    "--schedule-steps", type=int, default=2000, help="lockstep: the schedule length compiled in (default %(default)s)"
  )
  p.add_argument(
    "--save-executables",
    default=None,
    metavar="DIR",
    help="lockstep: also write each recipe's compiled train step to DIR, for `python -m research.lockstep run "
    "--precompiled DIR` on the target GPU (labtools/executables.py; one depth and layout)",
  )
  p.add_argument(
    "--save-hlo",
    default=None,
    metavar="DIR",
    help="also write each program's optimized HLO to DIR/<program label>.hlo.gz (for `python -m benchmarks perfmodel`)",
  )
  p.add_argument("--tag", default=None, help="results go to bench_aot_<target>_<tag>_cpu.* (default: no tag)")
  p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the results files go (default %(default)s)")
  p.set_defaults(mesh=None)  # one target GPU: the train step's mesh is the trainer's default


def _depths(value: str, flag: str = "--layers") -> list[int]:
  try:
    depths = [int(v) for v in value.split(",") if v.strip()]
  except ValueError:
    depths = []
  if not depths or min(depths) < 1:
    raise SystemExit(f"{flag}: expected comma-separated positive integers, got {value!r}")
  return depths


def _moe_shape(value: str) -> tuple[int, int, int]:
  parts = value.split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise SystemExit(f"--moe-shape {value}: expected KxNxE, e.g. 2048x768x64")
  k, n, e = map(int, parts)
  return k, n, e


def plan(args: argparse.Namespace, recipes: list[str]) -> list[tuple[dict, Callable[..., Any]]]:
  """[(row labels, lower(mesh) -> Lowered)] of every program to compile, in order."""
  programs = parse_list(args.program, list(PROGRAMS), "programs")
  todo = []
  if "ffn" in programs:
    for shape, (hidden, ffn_dim) in options.parse_shapes(args.shapes).items():
      for r in recipes:
        labels = {"program": "ffn", "shape": shape, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": args.tokens}
        todo.append(
          (
            {**labels, "recipe": r},
            functools.partial(lower_ffn, recipe=r, tokens=args.tokens, hidden=hidden, ffn_dim=ffn_dim),
          )
        )
  if "moe" in programs:
    k, n, e = _moe_shape(args.moe_shape)
    for impl in parse_list(args.moe_impl, ["auto", "pallas", "ragged", "tiled"], "grouped GEMMs"):
      for r in recipes:
        labels = {"program": "moe", "impl": impl, "tokens": args.moe_tokens, "k": k, "n": n, "experts": e}
        todo.append(
          (
            {**labels, "recipe": r},
            functools.partial(lower_moe, recipe=r, tokens=args.moe_tokens, k=k, n=n, experts=e, impl=impl),
          )
        )
  layouts = parse_list(args.layout, list(LAYOUTS), "layouts")
  for program in ("step", "lockstep"):
    if program not in programs:
      continue
    fn = lower_lockstep if program == "lockstep" else lambda mesh, **kw: lower_step(mesh, **kw)[0]
    for layout in layouts:
      for layers in _depths(args.layers):
        for n in _depths(args.grad_accum, "--grad-accum") if program == "step" else [1]:
          for r in recipes:
            labels = {"program": program, "preset": args.preset, "layers": layers, "batch": args.batch}
            labels |= {"seq": args.seq, "layout": layout} | ({"grad_accum": n} if n > 1 else {})
            at_n = argparse.Namespace(**{**vars(args), "grad_accum": n})
            lower = functools.partial(fn, recipe=r, preset=args.preset, layers=layers, args=at_n, scan=LAYOUTS[layout])
            todo.append(({**labels, "recipe": r}, lower))
  return todo


def _target_settings(target: str) -> dict[str, str]:
  """What names the target in the results: the TPU topology, or the digest of the GPU description."""
  if is_tpu(target):
    return {"target_topology": TPU_TARGETS[target]}
  return {"target_spec_sha256": hashlib.sha256(target_spec(target).encode()).hexdigest()[:16]}


def run(args: argparse.Namespace) -> dict:
  tpu = is_tpu(args.target)
  if tpu and not tpu_plugin_installed():
    raise SystemExit(MISSING_TPU_EXTRA)
  if not tpu and not cuda_plugin_installed():
    raise SystemExit(MISSING_EXTRA)
  if tpu and args.xla_timers:
    raise SystemExit("--xla-timers reads XLA:GPU's timer logs: not for a TPU target")
  use_cpu_host(args.xla_timers)
  recipes = recipe_names(args.recipes)
  opts = compiler_options(args.xla, tpu=tpu)
  target = _target_settings(args.target)
  devices = target_devices(args.target)
  mesh = target_mesh(devices)
  todo = plan(args, recipes)
  keep = _executable_writer(args, devices[0], opts)
  name = "aot_" + (args.target if args.target in TARGETS or tpu else pathlib.Path(args.target).stem)
  run_ = Run(
    name if not args.tag else f"{name}_{args.tag}",
    args.out_dir,
    title=f"python -m benchmarks aot --target {args.target}",
    target=args.target,
    target_device=devices[0].device_kind,
    **target,
    programs=args.program,
    recipes=",".join(recipes),
    compiler_options=opts,
    breakdown=args.breakdown,
    xla_timers=args.xla_timers,
    warmup=args.warmup,
    **{k: getattr(args, k) for k in _settings(args)},
  )
  rows: list[dict] = []
  paths = {}
  if args.warmup and todo:
    log(f"[aot] {args.target} {_label(todo[0][0])}: warm-up compile (not measured)")
    with contextlib.suppress(Exception):  # a failure shows again when the program is measured
      todo[0][1](mesh).compile(compiler_options=opts)
  for i, (labels, lower) in enumerate(todo):
    log(f"[aot] {args.target} {_label(labels)}: compiling, load {loadavg()}")
    try:
      save = functools.partial(keep, labels) if keep and labels["program"] == "lockstep" else None
      lower_ = functools.partial(lower, mesh)
      hlo_to = pathlib.Path(args.save_hlo) / f"{hlo_name(args.target, labels)}.hlo.gz" if args.save_hlo else None
      row = {**labels, **measure(lower_, opts, args.breakdown, args.xla_timers, save, tpu, hlo_to)}
    except Exception as e:  # a program that does not compile for the target is a result too
      row = {**labels, "error": (str(e).strip().splitlines() or [type(e).__name__])[0][:400]}
      log(f"[aot]   FAILED: {row['error']}")
    else:
      secs = f"compiled in {row['compile_s']:.1f}s ({row['compile_cpu_s']:.1f} CPU s)"
      log(f"[aot]   lowered in {row['lower_s']:.1f}s, {secs}, {aot_report.one_line(row)}")
    rows.append(row)
    text = aot_report.markdown(rows, devices[0].device_kind, tpu=tpu)
    paths = run_.write(rows, text, complete=i == len(todo) - 1)
  log(f"[aot] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": rows, "paths": paths}


def _executable_writer(args: argparse.Namespace, device, opts: dict):
  """keep(labels, lowered, compiled) writing the lockstep programs to --save-executables, or None."""
  if not args.save_executables:
    return None
  if "lockstep" not in args.program.split(",") or len(_depths(args.layers)) != 1 or "," in args.layout:
    raise SystemExit("--save-executables needs --program lockstep at one --layers depth and one --layout")
  info = {"target": args.target, "device_kind": device.device_kind, "compiler_options": opts}
  info["compute_capability"] = getattr(device, "compute_capability", None)

  def keep(labels, lowered, compiled):
    entry = executables.save(pathlib.Path(args.save_executables), labels["recipe"], lowered, compiled, info)
    log(f"[aot]   saved {labels['recipe']} to {args.save_executables} ({entry['bytes'] / 2**20:.1f} MiB)")

  return keep


def recipe_names(value: str) -> list[str]:
  """The comma-separated `--recipes`: registered names, NAME@FORMAT (gradient format) and NAME+fwd_e4m3
  (forward format) included, each checked by `s3r.recipe`."""
  from s3r import recipe

  names = [v.strip() for v in value.split(",") if v.strip()]
  for name in names:
    try:
      recipe(name)
    except ValueError as e:
      raise SystemExit(f"--recipes: {e}") from None
  return names


def _settings(args: argparse.Namespace) -> list[str]:
  programs = set(parse_list(args.program, list(PROGRAMS), "programs"))
  keys = []
  if "ffn" in programs:
    keys += ["shapes", "tokens"]
  if "moe" in programs:
    keys += ["moe_shape", "moe_tokens", "moe_impl"]
  if "step" in programs or "lockstep" in programs:
    keys += ["preset", "layers", "layout", "batch", "seq", "grad_accum", "remat", "attention", "vocab", "width", "seed"]
    keys += ["schedule_steps"]
  return keys


def hlo_name(target: str, labels: dict) -> str:
  """The file stem of a program's saved HLO: target, program, shape or model, recipe (no spaces or slashes)."""
  if labels["program"] == "ffn":
    what = f"ffn_{labels['shape']}_T{labels['tokens']}"
  elif labels["program"] == "moe":
    what = f"moe_{labels['impl']}_T{labels['tokens']}_{labels['k']}x{labels['n']}x{labels['experts']}"
  else:
    what = (
      f"{labels['program']}_{labels['preset']}_L{labels['layers']}_{labels['batch']}x{labels['seq']}_{labels['layout']}"
    )
    what += f"_ga{labels['grad_accum']}" if labels.get("grad_accum", 1) > 1 else ""
  name = f"{pathlib.Path(target).stem}_{what}_{labels['recipe']}"
  return re.sub(r"[^\w.@+-]", "_", name)


def _label(labels: dict) -> str:
  if labels["program"] == "ffn":
    return f"ffn {labels['shape']} T={labels['tokens']} {labels['recipe']}"
  if labels["program"] == "moe":
    shape = f"T={labels['tokens']} K={labels['k']} N={labels['n']} E={labels['experts']}"
    return f"moe {labels['impl']} {shape} {labels['recipe']}"
  shape = f"L={labels['layers']} {labels['batch']}x{labels['seq']}"
  shape += f" in {labels['grad_accum']} microbatches" if labels.get("grad_accum", 1) > 1 else ""
  return f"{labels['program']} {labels['preset']} {labels['layout']} {shape} {labels['recipe']}"
