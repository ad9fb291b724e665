"""`python -m benchmarks step`: training-step time and compiled memory of presets per recipe (Table IV).

For each configuration (a preset at one depth, `--preset a,b --layers 2,4` gives four), builds the
train step of `s3r train` with each recipe (`s3r.train.builder.build`: the model, the AdamW optimizer,
the shardings on `--mesh`, the state donated), compiles every recipe ahead of time
(in parallel threads; the compiled program's `memory_analysis()` gives its temporaries,
arguments and outputs), feeds a fixed random batch of token ids [B, S + 1] and times the steps
with the recipes interleaved (`benchmarks.timing`, Williams design). All recipes of a
configuration update ONE shared train state (same shapes and shardings; each call donates it and
the next gets the result), so memory holds one model, and every timed call is a real update.

Reports per recipe the median step time, tokens/s, speedups vs bf16 and vs int8_sr from the
same run, and memory; with two or more depths of one preset, the per-layer time and the step
time extrapolated to the preset's full depth (`benchmarks.step_report`). Results are written
after every configuration, so a run that is cut short keeps what finished. Only the block
projections are quantized (docs/algorithm.md §2); embedding, logits, attention and norms run in
bf16 for every recipe. `--attention auto` uses cuDNN flash attention on GPUs, XLA's elsewhere.
The training step of a model that is not an s3r preset, an Equinox transformer applied per example
under `jax.vmap`, is `python -m benchmarks eqx`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import os
import time
from collections.abc import Sequence

from benchmarks import options, step_report, timing
from labtools.results import RESULTS_DIR, Run, loadavg, log, parse_list

DEFAULT_RECIPES = ",".join(options.BENCH_RECIPES)
ATTENTION_CHOICES = ("auto", "xla", "cudnn")
MIB = 2**20


def resolve_attention(choice: str) -> str:
  """The attention kernel `--attention` asks for before any shape is known: auto is cudnn on GPUs,
  xla elsewhere (`build` then checks that cuDNN compiles at each preset's shapes)."""
  import jax

  if choice != "auto":
    return choice
  return "cudnn" if jax.default_backend() == "gpu" else "xla"


# The optimizer schedule of every measured step: AdamW with a short warm-up, far from its end
SCHEDULE = {"steps": 10_000, "lr": 1e-4, "warmup": 10}


def train_config(preset: str, recipe: str, args: argparse.Namespace):
  """The `s3r train` configuration whose step is measured: the bench's batch, sequence, seed and mesh."""
  from s3r.train.config import TrainConfig

  fields = {"batch": args.batch, "seq": args.seq, "seed": args.seed, "mesh": args.mesh, **SCHEDULE}
  fields["grad_accum"] = getattr(args, "grad_accum", 1)  # an int here (`benchmarks aot` sets one per program)
  return TrainConfig(out="unused", preset=preset, recipe=recipe, progress=False, **fields)


def model_overrides(args: argparse.Namespace, layers: int | None, attention: str | None = None) -> dict:
  """The bench's model fields beyond the trainer's: remat, attention kernel, and depth and width when set."""
  overrides = {"remat": args.remat == "full", "attention_impl": attention or resolve_attention(args.attention)}
  for field, value in (("n_layers", layers), ("d_model", args.width)):
    if value:
      overrides[field] = value
  return overrides


def vocab_size(preset: str, args: argparse.Namespace) -> int:
  from s3r.model import PRESETS

  return args.vocab or PRESETS[preset].vocab_size


def model_config(preset: str, recipe: str, args: argparse.Namespace, layers: int | None, attention: str | None = None):
  """The model of the measured step: the trainer's (`TrainConfig.model_config`) with the bench's overrides."""
  cfg = train_config(preset, recipe, args)
  return cfg.model_config(vocab_size(preset, args), **model_overrides(args, layers, attention))


def memory(compiled) -> dict:
  """XLA's compile-time memory estimate of one device: bytes of temporaries, arguments, outputs,
  donated aliases and their total (arguments + outputs - aliases + temporaries)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend reports it
    m = None
  if m is None:
    return {}
  out = {
    "temp": m.temp_size_in_bytes,
    "argument": m.argument_size_in_bytes,
    "output": m.output_size_in_bytes,
    "alias": m.alias_size_in_bytes,
  }
  out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return {k: int(v) for k, v in out.items()}


def flops(compiled) -> float | None:
  """XLA's cost-analysis FLOPs of the compiled step (custom calls such as cuDNN attention count 0)."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])
  except Exception:
    return None


def build(preset: str, layers: int | None, recipes: list[str], args: argparse.Namespace, mesh):
  """Compiled train steps of `preset` at depth `layers`, one per recipe, sharing one state.

  Each recipe's step is the trainer's: `s3r.train.builder.build` (model, optimizer, shardings,
  donated state), lowered by `builder.lower_train_step` as `s3r train` does.
  Returns (steppers {recipe: zero-argument callable}, per-recipe {compile_s, memory, flops}, model info)."""
  import jax
  import numpy as np

  from s3r import model as s3r_model
  from s3r.train import attention, builder

  impl, attention_note = attention.resolve(
    args.attention, model_config(preset, recipes[0], args, layers, "xla"), batch=args.batch, seq=args.seq
  )
  if attention_note:
    log(f"[step] {preset}: {attention_note}")
  vocab, overrides = vocab_size(preset, args), model_overrides(args, layers, impl)
  train_cfgs = {r: train_config(preset, r, args) for r in recipes}
  setups = {r: builder.build(c, vocab, mesh, **overrides) for r, c in train_cfgs.items()}
  setup = setups[recipes[0]]  # every recipe's state has its shapes and shardings
  first = setup.model_cfg
  batch_np = np.random.default_rng(args.seed).integers(0, vocab, train_cfgs[recipes[0]].batch_shape, dtype=np.int32)
  tokens, train_key = jax.device_put(batch_np, setup.batch_sharding), setup.keys["train"]
  holder = {"state": setup.init_state(setup.keys["init"])}
  # tracing stays on this thread; XLA compiles in parallel below
  lowered = {r: builder.lower_train_step(setups[r], c) for r, c in train_cfgs.items()}
  info = {}

  def compile_one(r):
    t0 = time.perf_counter()
    compiled = lowered[r].compile()
    return r, compiled, time.perf_counter() - t0

  threads = max(1, min(args.compile_threads or os.cpu_count() or 1, len(recipes)))
  compiled = {}
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for r, c, seconds in pool.map(compile_one, recipes):
      compiled[r] = c
      info[r] = {"compile_s": seconds, "memory": memory(c), "flops": flops(c)}
  lowered.clear()  # free the lowered programs

  def stepper(c):
    def one_step():
      holder["state"], metrics = c(holder["state"], tokens, train_key)
      return metrics

    return one_step

  model = {
    "preset": preset,
    "family": first.family,
    "params": s3r_model.param_count(first),
    "active_params": s3r_model.active_param_count(first),
    "n_layers": first.n_layers,
    "full_n_layers": s3r_model.PRESETS[preset].n_layers,
    "d_model": first.d_model,
    "d_ff": first.d_ff,
    "vocab_size": first.vocab_size,
    "remat": first.remat,
    "attention_impl": first.attention_impl,
    "attention_note": attention_note,
    "compile_threads": threads,
  }
  return {r: stepper(c) for r, c in compiled.items()}, info, model


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--preset", default="cpu-small", help="model preset(s), comma-separated (s3r models; default %(default)s)"
  )
  p.add_argument(
    "--layers",
    default=None,
    help="depth(s), comma-separated, each measured for every preset (default: the preset's own)",
  )
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (default %(default)s)")
  p.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
  p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default %(default)s)")
  p.add_argument(
    "--grad-accum",
    type=int,
    default=1,
    metavar="N",
    help="microbatches per step, as s3r train --grad-accum (--batch stays the global batch; default %(default)s)",
  )
  p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
  p.add_argument("--width", type=int, default=None, help="model width override, for tests (default: the preset's)")
  p.add_argument(
    "--remat",
    choices=("none", "full"),
    default="none",
    help="full: rematerialize every block in the backward pass, as the paper's Table IV (default %(default)s)",
  )
  p.add_argument(
    "--mesh",
    default=None,
    help="device mesh, e.g. data=1,fsdp=4,tensor=2 (s3r.train.step.sharding; default: one device)",
  )
  p.add_argument(
    "--attention",
    choices=ATTENTION_CHOICES,
    default="auto",
    help="attention kernel: auto (cudnn on GPU, else xla), xla or cudnn (default %(default)s)",
  )
  p.add_argument("--repeats", type=int, default=10, help="timed steps per recipe, interleaved (default %(default)s)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first call (default %(default)s)")
  p.add_argument("--prime", type=int, default=1, help="untimed steps before each timed one (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of parameters, batch and keys (default %(default)s)")
  p.add_argument(
    "--compile-threads", type=int, default=None, help="recipes compiled in parallel (default: min(recipes, CPU cores))"
  )
  p.add_argument(
    "--tag", default=None, help="results go to bench_step_<tag>_<platform>.* (default: bench_step_<platform>.*)"
  )
  p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the results files go (default %(default)s)")
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def _depths(value: str | None) -> Sequence[int | None]:
  if not value:
    return [None]
  try:
    depths = [int(v) for v in value.split(",") if v.strip()]
  except ValueError:
    raise SystemExit(f"--layers: expected comma-separated positive integers, got {value!r}") from None
  if not depths or min(depths) < 1:
    raise SystemExit(f"--layers: expected comma-separated positive integers, got {value!r}")
  return depths


def make_mesh(spec: str | None):
  import jax

  from s3r.train.step import sharding

  try:
    return sharding.make_mesh(sharding.parse_mesh(spec, jax.device_count()))
  except ValueError as e:
    raise SystemExit(str(e)) from None


def measure(preset: str, layers: int | None, recipes: list[str], args: argparse.Namespace, mesh) -> dict:
  """One configuration: compile, check memory, time interleaved; a row per recipe."""
  steppers, info, model = build(preset, layers, recipes, args, mesh)
  log(
    f"[step] {preset} L={model['n_layers']} ({model['params']:,} params), B={args.batch}, S={args.seq}, "
    f"remat={args.remat}, attention={model['attention_impl']}, load {loadavg()}; compiled in "
    + ", ".join(f"{r} {i['compile_s']:.1f}s" for r, i in info.items())
  )
  # the state and batch (the arguments) are already allocated; a step needs its outputs and temporaries besides
  need = max((m["total"] - m["argument"] for m in (i["memory"] for i in info.values()) if m), default=0)
  free = free_device_memory()
  if free is not None and need > free:
    return {
      "model": model,
      "skipped": f"needs {need / 2**30:.1f} GiB per device beyond its state, {free / 2**30:.1f} GiB free",
      "recipes": {r: {"memory": i["memory"], "compile_s": i["compile_s"]} for r, i in info.items()},
    }
  timings = timing.time_interleaved(
    {r: (fn, ()) for r, fn in steppers.items()},
    repeats=args.repeats,
    warmup=args.warmup,
    prime=args.prime,
    seed=args.seed,
    log=log,
  )
  log("  " + ", ".join(f"{r} {t.median * 1e3:.1f} ms" for r, t in timings.items()))
  rows = {}
  for r, t in timings.items():
    row = {"timing": t.as_dict(), "tokens_per_s": args.batch * args.seq / t.median, **info[r]}
    for ref in ("bf16", "int8_sr"):
      if ref in timings:
        row[f"speedup_vs_{ref}"] = timings[ref].median / t.median
        row[f"speedup_vs_{ref}_paired"] = timing.paired_ratio(timings[ref], t)
    rows[r] = row
  return {"model": model, "recipes": rows}


def free_device_memory() -> int | None:
  """The first device's allocator limit minus its use (None on CPU or when unknown)."""
  import jax

  stats = jax.local_devices()[0].memory_stats() or {}
  return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0)) if "bytes_limit" in stats else None


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES
  from s3r.model import PRESETS

  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  presets = parse_list(args.preset, list(PRESETS), "presets")
  depths = _depths(args.layers)
  mesh = make_mesh(args.mesh)
  run_ = Run(
    "step" if not args.tag else f"step_{args.tag}",
    args.out_dir,
    preset=args.preset,
    layers=args.layers,
    recipes=",".join(recipes),
    batch=args.batch,
    seq=args.seq,
    grad_accum=args.grad_accum,
    vocab=args.vocab,
    width=args.width,
    remat=args.remat,
    mesh=dict(mesh.shape),
    attention=resolve_attention(args.attention),
    repeats=args.repeats,
    warmup=args.warmup,
    prime=args.prime,
    seed=args.seed,
  )
  results = {"batch": args.batch, "seq": args.seq, "remat": args.remat, "mesh": dict(mesh.shape), "configs": []}
  results["grad_accum"] = args.grad_accum
  todo = [(p, d) for p in presets for d in depths]
  paths = {}
  for i, (preset, layers) in enumerate(todo):
    try:
      results["configs"].append(measure(preset, layers, recipes, args, mesh))
    except Exception as e:  # e.g. out of device memory: record it and go on with the next configuration
      if not _is_resource_error(e):
        raise
      results["configs"].append({"model": {"preset": preset, "n_layers": layers}, "skipped": _first_line(e)})
      log(f"[step] {preset} L={layers}: skipped ({_first_line(e)})")
    gc.collect()
    step_report.summarize(results)
    paths = run_.write(
      results,
      step_report.markdown(results),
      complete=i == len(todo) - 1,
      chart=None if args.no_chart else functools.partial(step_report.chart, results),
    )
    log(f"[step] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def _is_resource_error(e: Exception) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
