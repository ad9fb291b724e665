"""`python -m benchmarks scan`: the scanned decoder (`scan_layers=True`, the default) against the same
parameters run as an unrolled Python loop: train-step compile time per depth and step time.

Compile time. For each recipe, the train step of `s3r train` (`s3r.train.builder.build` and
`lower_train_step`: model, AdamW, shardings, donated state) of `--compile-preset` at each depth of
`--depths`, scanned and unrolled, is traced and lowered (`lower_s`) and compiled by XLA
(`compile_s`); nothing is cached between them (no persistent compilation cache; each program is a new
lowering). The measurements run in rounds, every (recipe, depth, layout) once per round in a rotated
order; the minimum over `--compile-repeats` rounds is reported. The target: for every recipe the
scanned step at the deepest depth compiles (lower + compile) within 1.25x of the shallowest.

Step time. For each preset of `--step-presets` at `--step-layers` layers, the compiled train steps of
every recipe, scanned and unrolled, update one shared train state (both layouts hold the same stacked
parameters) and are timed interleaved (`benchmarks.timing`), in wall-clock seconds and in this process's
CPU seconds (all threads; other processes on a loaded machine change it less). Per recipe and clock: the
ratio unrolled / scanned of the medians (> 1: the scan is faster), the paired ratio (median of the
same-round ratios) and its distribution-free 95% interval (`timing.paired_ratio_interval`). The target,
the scanned step no slower than the unrolled one, counts as met at a 5% resolution when the interval
lies above 0.95, missed when it lies below 0.95, and not resolved otherwise.

Files: bench_scan[_<tag>]_<platform>.{json,md} in `--out-dir` (default runs/results).
"""

from __future__ import annotations

import argparse
import time

from benchmarks import options, timing
from labtools.analysis.hlo import hlo_text
from labtools.results import RESULTS_DIR, Run, loadavg, log, markdown_table, parse_list

TARGET_RATIO = 1.25  # deepest / shallowest compile time of the scanned step
RESOLUTION = 0.05  # the step-time target: unrolled / scanned time at least 1 - RESOLUTION
LAYOUTS = {"scan": True, "unrolled": False}  # scan_layers of each layout


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--recipes", default=",".join(options.BENCH_RECIPES), help="comma-separated (default %(default)s)")
  p.add_argument("--compile-preset", default="paper-12l", help="preset of the compile-time part (default %(default)s)")
  p.add_argument("--depths", default="2,12", help="depths of the compile-time part (default %(default)s)")
  p.add_argument("--compile-batch", type=int, default=2, help="sequences per compiled step (default %(default)s)")
  p.add_argument("--compile-repeats", type=int, default=2, help="rounds of compiles; the minimum counts (default 2)")
  p.add_argument(
    "--step-presets", default="cpu-small,paper-12l", help="presets of the step-time part (default %(default)s)"
  )
  p.add_argument("--step-layers", type=int, default=2, help="depth of the step-time part (default %(default)s)")
  p.add_argument("--step-batch", type=int, default=8, help="sequences per timed step (default %(default)s)")
  p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default %(default)s)")
  p.add_argument("--repeats", type=int, default=6, help="timed steps per recipe and layout (default %(default)s)")
  p.add_argument("--prime", type=int, default=1, help="untimed steps before each timed one (default %(default)s)")
  p.add_argument("--skip", choices=("none", "compile", "step"), default="none", help="leave one part out")
  p.add_argument("--seed", type=int, default=0, help="seed of parameters, batch and keys (default %(default)s)")
  p.add_argument(
    "--tag", default=None, help="results go to bench_scan_<tag>_<platform>.* (default: bench_scan_<platform>.*)"
  )
  p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the results files go (default %(default)s)")


def _train_config(preset: str, recipe: str, batch: int, args: argparse.Namespace):
  from s3r.train.config import TrainConfig

  return TrainConfig(
    out="unused", preset=preset, recipe=recipe, batch=batch, seq=args.seq, seed=args.seed, progress=False
  )


def _setup(preset: str, recipe: str, layers: int, scan: bool, batch: int, args: argparse.Namespace, mesh):
  from s3r.model import PRESETS
  from s3r.train import builder

  cfg = _train_config(preset, recipe, batch, args)
  setup = builder.build(cfg, PRESETS[preset].vocab_size, mesh, n_layers=layers, scan_layers=scan)
  return cfg, setup


def compile_once(preset: str, recipe: str, layers: int, scan: bool, args: argparse.Namespace, mesh) -> dict:
  """{lower_s, compile_s, total_s, hlo_lines} of one fresh train-step program."""
  from s3r.train import builder

  cfg, setup = _setup(preset, recipe, layers, scan, args.compile_batch, args, mesh)
  t0 = time.perf_counter()
  lowered = builder.lower_train_step(setup, cfg)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0, "hlo_lines": hlo_text(compiled).count("\n")}


def compile_part(recipes: list[str], depths: list[int], args: argparse.Namespace, mesh) -> dict:
  cases = [(r, d, layout) for r in recipes for d in depths for layout in LAYOUTS]
  runs: dict[tuple, list[dict]] = {c: [] for c in cases}
  for round_ in range(args.compile_repeats):
    shift = round_ * len(cases) // max(args.compile_repeats, 1)
    for r, d, layout in cases[shift:] + cases[:shift]:
      m = compile_once(args.compile_preset, r, d, LAYOUTS[layout], args, mesh)
      runs[(r, d, layout)].append(m)
      log(f"[scan] compile {r} L={d} {layout}: {m['lower_s']:.1f} + {m['compile_s']:.1f} s (load {loadavg()})")
  out: dict = {}
  for (r, d, layout), ms in runs.items():
    best = min(ms, key=lambda m: m["total_s"])
    out.setdefault(r, {}).setdefault(layout, {})[str(d)] = {**best, "all_total_s": [m["total_s"] for m in ms]}
  for r in out:
    for layout in LAYOUTS:
      t = out[r][layout]
      out[r][layout]["ratio_deepest_to_shallowest"] = t[str(max(depths))]["total_s"] / t[str(min(depths))]["total_s"]
  return out


def step_part(preset: str, recipes: list[str], args: argparse.Namespace, mesh) -> dict:
  import jax
  import numpy as np

  from s3r.model import PRESETS
  from s3r.train import builder

  steppers, compile_s = {}, {}
  holder: dict = {}
  for r in recipes:
    for layout, scan in LAYOUTS.items():
      cfg, setup = _setup(preset, r, args.step_layers, scan, args.step_batch, args, mesh)
      if "state" not in holder:  # one state for all: the layouts hold the same stacked parameters
        holder["state"] = setup.init_state(setup.keys["init"])
        batch = np.random.default_rng(args.seed).integers(0, PRESETS[preset].vocab_size, cfg.batch_shape)
        holder["tokens"] = jax.device_put(batch.astype(np.int32), setup.batch_sharding)
        holder["key"] = setup.keys["train"]
      t0 = time.perf_counter()
      compiled = builder.lower_train_step(setup, cfg).compile()
      compile_s[f"{r}/{layout}"] = time.perf_counter() - t0

      def one_step(c=compiled):
        holder["state"], metrics = c(holder["state"], holder["tokens"], holder["key"])
        return metrics

      steppers[f"{r}/{layout}"] = (one_step, ())
  log(f"[scan] timing {preset}: {len(steppers)} programs x {args.repeats} rounds (load {loadavg()})")
  timings = timing.time_interleaved(steppers, repeats=args.repeats, warmup=1, prime=args.prime, seed=args.seed, log=log)
  log(f"[scan] timed {preset} (load {loadavg()})")
  out: dict = {}
  for r in recipes:
    scan, loop = timings[f"{r}/scan"], timings[f"{r}/unrolled"]
    out[r] = {
      "scan": {"timing": scan.as_dict(), "compile_s": compile_s[f"{r}/scan"]},
      "unrolled": {"timing": loop.as_dict(), "compile_s": compile_s[f"{r}/unrolled"]},
      "wall": ratios(loop, scan),
      "cpu": ratios(loop.cpu(), scan.cpu()),
    }
    w, c = out[r]["wall"], out[r]["cpu"]
    log(
      f"[scan] {preset} L={args.step_layers} {r}: unrolled / scan {w['paired']:.3f} wall ({w['verdict']}), "
      f"{c['paired']:.3f} CPU ({c['verdict']})"
    )
  return out


def ratios(loop: timing.Timing, scan: timing.Timing) -> dict:
  """unrolled / scanned: ratio of medians, paired ratio, its 95% interval and the target's verdict."""
  ci = timing.paired_ratio_interval(loop, scan)
  return {
    "unrolled_ms": loop.median * 1e3,
    "scan_ms": scan.median * 1e3,
    "of_medians": loop.median / scan.median,
    "paired": timing.paired_ratio(loop, scan),
    "paired_ci95": ci,
    "verdict": verdict(ci),
  }


def verdict(ci: tuple[float, float] | None) -> str:
  """The step-time target at RESOLUTION from the 95% interval of unrolled / scanned."""
  if ci is None:
    return "too few rounds"
  if ci[0] >= 1 - RESOLUTION:
    return "met"
  return "missed" if ci[1] < 1 - RESOLUTION else "not resolved"


def markdown(results: dict, args: argparse.Namespace) -> str:
  lines = []
  comp = results.get("compile")
  if comp:
    depths = results["depths"]
    lo, hi = str(min(depths)), str(max(depths))
    lines.append(
      f"## Train-step compile time, `{args.compile_preset}`, batch {args.compile_batch} x {args.seq} "
      f"(trace + lower, then XLA compile; seconds, the minimum of {args.compile_repeats})\n"
    )
    rows = []
    for r, by in comp.items():
      row = [r]
      for layout in LAYOUTS:
        row += [f"{by[layout][d]['total_s']:.1f}" for d in (lo, hi)] + [
          f"{by[layout]['ratio_deepest_to_shallowest']:.2f}"
        ]
      row.append("yes" if by["scan"]["ratio_deepest_to_shallowest"] <= TARGET_RATIO else "no")
      rows.append(row)
    headers = ["recipe"]
    for layout in LAYOUTS:
      headers += [f"{layout} L={lo}", f"{layout} L={hi}", f"{layout} ratio"]
    headers.append(f"scan ratio <= {TARGET_RATIO}")
    lines.append(markdown_table(headers, rows))
  for preset, by in results.get("step", {}).items():
    lines.append(
      f"## Step time, `{preset}` at {args.step_layers} layers, batch {args.step_batch} x {args.seq} "
      f"({args.repeats} interleaved rounds, {args.prime} untimed step before each timed one; median ms; "
      f"paired: median of the same-round ratios unrolled / scan, > 1: the scan is faster; 95% interval; "
      f"target: interval above {1 - RESOLUTION:.2f})\n"
    )
    rows = []
    for r, v in by.items():
      rows.append([r, *_ratio_cells(v["wall"]), *_ratio_cells(v["cpu"])])
    head = ["recipe"] + [f"{clock} {col}" for clock in ("wall", "CPU") for col in _RATIO_COLUMNS]
    lines.append(markdown_table(head, rows))
  return "\n".join(lines)


_RATIO_COLUMNS = ("scan ms", "unrolled ms", "paired", "95% interval", "target")


def _ratio_cells(v: dict) -> list[str]:
  ci = v["paired_ci95"]
  interval = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else ""
  return [f"{v['scan_ms']:.0f}", f"{v['unrolled_ms']:.0f}", f"{v['paired']:.3f}", interval, v["verdict"]]


def run(args: argparse.Namespace) -> dict:
  import jax

  from s3r import RECIPES
  from s3r.model import PRESETS
  from s3r.train.step import sharding

  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  depths = [int(d) for d in args.depths.split(",") if d.strip()]
  presets = parse_list(args.step_presets, list(PRESETS), "presets")
  mesh = sharding.make_mesh(sharding.parse_mesh(None, jax.device_count()))
  settings = {k: v for k, v in vars(args).items() if k not in ("func", "bench_command", "out_dir", "tag")}
  run_ = Run("scan" if not args.tag else f"scan_{args.tag}", args.out_dir, **settings)
  results: dict = {"depths": depths, "target_ratio": TARGET_RATIO}
  paths: dict = {}
  if args.skip != "compile":
    results["compile"] = compile_part(recipes, depths, args, mesh)
    paths = run_.write(results, markdown(results, args), complete=args.skip == "step")
  if args.skip != "step":
    results["step"] = {}
    for i, preset in enumerate(presets):
      results["step"][preset] = step_part(preset, recipes, args, mesh)
      paths = run_.write(results, markdown(results, args), complete=i == len(presets) - 1)
  log(f"[scan] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}
