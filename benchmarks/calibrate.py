"""`python -m benchmarks calibrate run|collect|install`: per-kernel device times of real programs, for the
performance model (`scripts/device_calibrate.sh` runs it on a lent GPU).

run: for each program of `--programs` and each recipe of `--recipes`, compiles the program (its compile
seconds kept), writes its optimized HLO (`programs/<program>/<recipe>.hlo.txt`, the names its kernels are
mapped to), warms it up, traces `--iters` calls with `s3r.train.run.profiling.trace` and reads the kernels'
device times back (`benchmarks.trace_kernels`: per HLO instruction, seconds and launches per call), then
times `--repeats` samples of `--number` calls (`benchmarks.timing`): `programs/<program>/<recipe>.json`,
written as each finishes. No program starts once `--budget` seconds are spent (`programs/skipped.json`);
a program already measured in the folder is not measured again, so a second run goes on where one stopped.
Programs:
- `ffn_W<n>`: the SwiGLU FFN block forward + backward of `python -m benchmarks ffn` at the paper's shape
  W<n>, `--tokens` tokens;
- `step`: the train step of `s3r train` as `python -m benchmarks step` builds it (full remat, cuDNN
  attention where it compiles), `--step-preset` sliced to `--step-layers` layers, `--step-batch` x
  `--step-seq` tokens; named `step_<preset>_<layers>l`.
Recipes: registered names (`s3r_ec_dx@e5m2+fwd_e4m3` included) and `bf16_f32bwd`, FFN only: the bf16 block
as it was before every GEMM took bf16 operands (each projection a bf16 dot with an f32 product, cast to
bf16; autodiff makes the backward GEMMs f32 x f32).
`--target h100|h200` compiles the same programs deviceless instead (the `gpu-aot` extra; abstract
arguments, nothing timed): the check that every program of a device call compiles for the GPU at its real
sizes, with each program's GEMMs and memory.

collect DIR: `DIR/calibration.json` for the model from `DIR/programs/` and the GEMM sweeps under `DIR`
(`bench_gemm_sweep*.json`). install SRC: SRC's calibration.json (SRC a file or a folder holding one) to
`results/perfmodel/calibration_<device>.json`, refused if that file exists (`--force` replaces it).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import time

from benchmarks import gemm_backends, options, timing, trace_kernels
from labtools.results import git_info, log, write_json

ACTIONS = ("run", "collect", "install")
BF16_F32BWD = "bf16_f32bwd"
DEFAULT_PROGRAMS = "ffn_W9,ffn_W3,step"
DEFAULT_RECIPES = f"int8_rtne,bf16,s3r_ec_dx,s3r_ec_dx@e5m2+fwd_e4m3,{BF16_F32BWD}"
PERFMODEL_DIR = pathlib.Path("results/perfmodel")
MAX_TRACE_BYTES = 4 * 2**20  # traces kept beside the tables up to this size


def block_f32bwd(x, wg, wu, wd, key):
  """The FFN block with each projection a bf16 x bf16 dot whose product is f32, cast to bf16 (`key` unused)."""
  import jax
  import jax.numpy as jnp

  def proj(a, w):
    product = jax.lax.dot_general(
      a.astype(jnp.bfloat16),
      w.astype(jnp.bfloat16),
      (((a.ndim - 1,), (0,)), ((), ())),
      preferred_element_type=jnp.float32,
    )
    return product.astype(jnp.bfloat16)

  return proj(jax.nn.silu(proj(x, wg)) * proj(x, wu), wd)


def program_names(value: str, step_preset: str, step_layers: int) -> list[str]:
  """The program names of `--programs` (`step` named after its preset and depth)."""
  names = []
  for item in (v.strip() for v in value.split(",") if v.strip()):
    if item == "step":
      names.append(f"step_{step_preset}_{step_layers}l")
    elif item.startswith("ffn_") and item[4:] in options.parse_shapes(item[4:]):
      names.append(item)
    else:
      raise SystemExit(f"--programs {item}: expected ffn_W1..ffn_W9, ffn_HxD or step")
  return names


def _ffn_build(recipe: str, shape: str, tokens: int, mesh=None):
  """() -> (lowered, call factory): the FFN block's program; on `mesh` (a target's) lowered from abstract
  arguments with no factory."""
  import jax
  import jax.numpy as jnp

  from benchmarks import ffn

  ((hidden, ffn_dim),) = options.parse_shapes(shape).values()
  fn = ffn.fwd_bwd_of(block_f32bwd if recipe == BF16_F32BWD else ffn.make_ffn(recipe))
  if mesh is None:
    args = ffn.make_inputs(tokens, hidden, ffn_dim)
    return fn.lower(*args), lambda compiled: lambda: compiled(*args)
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  rep = NamedSharding(mesh, P())
  arr = lambda shape_, dtype: jax.ShapeDtypeStruct(shape_, dtype, sharding=rep)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  f32 = jnp.float32
  args = (arr((tokens, hidden), jnp.bfloat16), arr((hidden, ffn_dim), f32), arr((hidden, ffn_dim), f32))
  args += (arr((ffn_dim, hidden), f32), arr((tokens, hidden), jnp.bfloat16), key)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return fn.lower(*args), None


def _step_namespace(args: argparse.Namespace) -> argparse.Namespace:
  """The settings `benchmarks.step` and `benchmarks.aot_programs` read to build the train step."""
  fields = {"batch": args.step_batch, "seq": args.step_seq, "seed": 0, "mesh": None, "remat": "full"}
  fields |= {"attention": "auto", "vocab": None, "width": args.step_width, "preset": args.step_preset}
  return argparse.Namespace(**fields)


def _step_build(recipe: str, args: argparse.Namespace, mesh=None):
  """() -> (lowered, call factory): the trainer's train step, its state initialized on the device (a call
  advances it: the state is donated); on a target's `mesh` lowered from abstract values, no factory."""
  ns = _step_namespace(args)
  if mesh is not None:
    from benchmarks import aot_programs

    return aot_programs.lower_step(mesh, recipe, args.step_preset, args.step_layers, ns)[0], None
  import jax
  import numpy as np

  from benchmarks import step
  from s3r.train import attention, builder

  mcfg = step.model_config(args.step_preset, recipe, ns, args.step_layers, "xla")
  impl, _ = attention.resolve(ns.attention, mcfg, batch=ns.batch, seq=ns.seq)
  cfg = step.train_config(args.step_preset, recipe, ns)
  setup = builder.build(
    cfg, step.vocab_size(args.step_preset, ns), step.make_mesh(None), **step.model_overrides(ns, args.step_layers, impl)
  )
  batch = np.random.default_rng(0).integers(0, mcfg.vocab_size, cfg.batch_shape, dtype=np.int32)
  tokens = jax.device_put(batch, setup.batch_sharding)
  holder = {"state": setup.init_state(setup.keys["init"])}

  def factory(compiled):
    def call():
      holder["state"], metrics = compiled(holder["state"], tokens, setup.keys["train"])
      return metrics

    return call

  return builder.lower_train_step(setup, cfg), factory


def _build(program: str, recipe: str, args: argparse.Namespace, mesh=None):
  if program.startswith("ffn_"):
    return _ffn_build(recipe, program[4:], args.tokens, mesh)
  return _step_build(recipe, args, mesh)


def _trace(call, iters: int, folder: pathlib.Path) -> pathlib.Path | None:
  """Traces `iters` calls into `folder`; the trace file (None if the profiler wrote none)."""
  import jax

  from s3r.train.run import profiling

  with profiling.trace(folder):
    for _ in range(iters):
      jax.block_until_ready(call())
  files = profiling.trace_files(folder)
  return files[-1] if files else None


def measure(program: str, recipe: str, args: argparse.Namespace, out: pathlib.Path, mesh=None) -> dict:
  """One program and recipe: compile, HLO, GEMMs; on a device also the traced kernels and the timing."""
  import jax

  folder = out / "programs" / program
  folder.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  lowered, factory = _build(program, recipe, args, mesh)
  compiled = lowered.compile()
  row: dict = {"program": program, "recipe": recipe, "compile_s": time.perf_counter() - t0}
  text = compiled.as_text() or ""
  (folder / f"{recipe}.hlo.txt").write_text(text)
  gemms = gemm_backends.gemms(text)
  row |= {"gemms": gemms, "gemm_census": gemm_backends.census(gemms)}
  if factory is None:  # deviceless: what XLA made of it, no timing
    from benchmarks import aot_report

    return row | {"memory": aot_report.memory(compiled)}
  call = factory(compiled)
  for _ in range(args.warmup):
    jax.block_until_ready(call())
  trace = _trace(call, args.iters, folder / f"{recipe}.trace")
  if trace is not None:
    table = trace_kernels.kernel_table(trace_kernels.read_events(trace), text, args.iters, jax.default_backend())
    row |= {"kernel_seconds": table["seconds"], "unmapped_seconds": table["unmapped_seconds"]}
    row["kernels"] = table["kernels"]
    if not table["kernels"]:
      log(f"[calibrate]   no {jax.default_backend()} kernel events in the trace {trace} (the profiler saw no device)")
    if trace.stat().st_size <= MAX_TRACE_BYTES:
      shutil.copy(trace, folder / f"{recipe}.xplane.pb")
  shutil.rmtree(folder / f"{recipe}.trace", ignore_errors=True)
  t = timing.time_interleaved({recipe: (call, ())}, repeats=args.repeats, warmup=0, number=args.number)[recipe]
  return row | {"step_seconds": t.median, "timing": t.as_dict()}


def _meta(device_kind: str) -> dict:
  import jax

  # REVISION, where set, names the commit (a device's copy of the tree has no .git)
  revision = (os.environ.get("REVISION") or git_info().get("revision") or "unknown")[:12]
  date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  device = next((d for d in ("h100", "h200", "b200", "a100") if d in device_kind.lower()), device_kind.lower())
  device = "".join(c if c.isalnum() else "_" for c in device)
  return {"device": device, "device_kind": device_kind, "jax": jax.__version__, "revision": revision, "date": date}


def run(args: argparse.Namespace) -> dict:
  _check(args)
  return {"run": _run, "collect": _collect, "install": _install}[args.action](args)


def _run(args: argparse.Namespace) -> dict:
  if os.environ.get("JAX_PLATFORMS") == "cpu" and args.target is None:
    from benchmarks import profile

    profile.enable_traceme()  # XLA:CPU's per-thunk trace events, before its backend starts
  mesh = None
  if args.target is not None:
    from benchmarks import aot

    if not aot.cuda_plugin_installed():
      raise SystemExit(aot.MISSING_EXTRA)
    aot.use_cpu_host()
    mesh = aot.target_mesh(aot.target_devices(args.target))
  import jax

  from benchmarks.aot import recipe_names

  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  kind = mesh.devices.flat[0].device_kind if mesh is not None else jax.devices()[0].device_kind
  write_json(out / "meta.json", {**_meta(kind), "xla_flags": os.environ.get("XLA_FLAGS", ""), "target": args.target})
  programs = program_names(args.programs, args.step_preset, args.step_layers)
  recipes = [r for r in args.recipes.split(",") if r.strip()]
  recipe_names(",".join(r for r in recipes if r != BF16_F32BWD))  # refuses an unknown name up front
  t0, rows, skipped = time.perf_counter(), [], []
  for program in programs:
    for recipe in recipes:
      if recipe == BF16_F32BWD and not program.startswith("ffn_"):
        continue  # the emulated old bf16 is an FFN block only
      done = out / "programs" / program / f"{recipe}.json"
      if done.exists() and "error" not in json.loads(done.read_text()) and mesh is None:
        log(f"[calibrate] {program} {recipe}: measured already ({done})")
        continue  # a second run into the same folder goes on where the first stopped
      if args.budget is not None and time.perf_counter() - t0 > args.budget:
        skipped.append({"program": program, "recipe": recipe, "why": f"budget of {args.budget:.0f}s spent"})
        continue
      log(f"[calibrate] {program} {recipe}: {'compiling for ' + str(args.target) if mesh is not None else 'measuring'}")
      try:
        row = measure(program, recipe, args, out, mesh)
      except Exception as e:  # a program that fails is a result too; the others still run
        row = {
          "program": program,
          "recipe": recipe,
          "error": (str(e).strip().splitlines() or [type(e).__name__])[0][:400],
        }
        log(f"[calibrate]   FAILED: {row['error']}")
      else:
        secs = f", {row['step_seconds'] * 1e3:.2f} ms per call" if "step_seconds" in row else ""
        log(f"[calibrate]   compiled in {row['compile_s']:.1f}s{secs}; GEMMs: {gemm_backends.census(row['gemms'])}")
      write_json(out / "programs" / program / f"{recipe}.json", row)
      rows.append(row)
  write_json(out / "programs" / "skipped.json", skipped)
  return {"results": rows, "skipped": skipped}


def calibration(folder: pathlib.Path) -> dict:
  """The calibration file's content from a `run` folder and the GEMM sweeps under it."""
  meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
  out = {k: meta.get(k, "") for k in ("device", "device_kind", "jax", "revision", "date", "xla_flags")}
  out |= {"gemms": [], "programs": []}
  for path in sorted(folder.rglob("bench_gemm_sweep*.json")):
    doc = json.loads(path.read_text())
    options_ = doc["settings"].get("compiler_options", {}).items()
    flags = " ".join(f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options_)
    flags = " ".join(f for f in (doc["meta"].get("xla_flags", ""), flags) if f)
    for r in doc["results"]:
      if "seconds" in r:
        row = {k: r[k] for k in ("dtype", "m", "n", "k", "shape", "gemm", "seconds", "backend", "tile", "kernels")}
        out["gemms"].append(row | {"iqr_s": r["iqr_s"], "xla_flags": flags})
        if not out["device_kind"]:
          out |= {k: v for k, v in _meta_from(doc).items() if not out.get(k)}
  for path in sorted(folder.glob("programs/*/*.json")):
    r = json.loads(path.read_text())
    if isinstance(r, dict) and "step_seconds" in r:
      kernels = [
        {"name": k["name"], "seconds": k["seconds"], "count": k["count"], "hlo": k["hlo"]} for k in r.get("kernels", [])
      ]
      entry = {"program": r["program"], "recipe": r["recipe"], "step_seconds": r["step_seconds"], "kernels": kernels}
      out["programs"].append(entry | {"compile_s": r["compile_s"], "kernel_seconds": r.get("kernel_seconds")})
  return out


def _meta_from(doc: dict) -> dict:
  kind = doc["meta"].get("device_kind") or ""
  git = (doc["meta"].get("git") or {}).get("revision") or ""
  return {
    "device_kind": kind,
    "device": _meta(kind)["device"] if kind else "",
    "jax": doc["meta"].get("jax_version", ""),
  } | ({"revision": git[:12]} if git else {})


def _collect(args: argparse.Namespace) -> dict:
  folder = pathlib.Path(args.path)
  found = calibration(folder)
  write_json(folder / "calibration.json", found)
  log(f"[calibrate] {folder / 'calibration.json'}: {len(found['gemms'])} GEMMs, {len(found['programs'])} programs")
  return found


def _install(args: argparse.Namespace) -> dict:
  src = pathlib.Path(args.path)
  src = src / "calibration.json" if src.is_dir() else src
  if not src.is_file():
    raise SystemExit(f"calibrate install {args.path}: no calibration.json there")
  found = json.loads(src.read_text())
  if not found.get("device"):
    raise SystemExit(f"calibrate install {src}: the file names no device")
  dest = pathlib.Path(args.out_dir) / f"calibration_{found['device']}.json"
  if dest.exists() and not args.force:
    raise SystemExit(f"calibrate install: {dest} exists (--force replaces it)")
  dest.parent.mkdir(parents=True, exist_ok=True)
  shutil.copy(src, dest)
  log(f"[calibrate] {src} -> {dest}")
  return {"path": str(dest)}


RUN_DIR = "runs/calibrate"  # where `run` writes by default


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("action", choices=ACTIONS, help="run (measure), collect DIR, install SRC")
  p.add_argument("path", nargs="?", default=None, help="collect: the run folder; install: its calibration.json")
  p.add_argument(
    "--programs", default=DEFAULT_PROGRAMS, help="ffn_W<n> and step, comma-separated (default %(default)s)"
  )
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated (default %(default)s)")
  p.add_argument("--tokens", type=int, default=16384, help="tokens of the FFN block (default %(default)s)")
  p.add_argument("--step-preset", default="paper-12l", help="preset of the train step (default %(default)s)")
  p.add_argument("--step-layers", type=int, default=2, help="its depth (default %(default)s)")
  p.add_argument("--step-batch", type=int, default=8, help="its sequences per step (default %(default)s)")
  p.add_argument("--step-seq", type=int, default=2048, help="its tokens per sequence (default %(default)s)")
  p.add_argument("--step-width", type=int, default=None, help="its width override, for tests (default: the preset's)")
  p.add_argument("--iters", type=int, default=3, help="traced calls per program (default %(default)s)")
  p.add_argument("--warmup", type=int, default=2, help="untimed calls after compiling (default %(default)s)")
  p.add_argument("--repeats", type=int, default=5, help="timed samples per program (default %(default)s)")
  p.add_argument("--number", type=int, default=2, help="calls per timed sample (default %(default)s)")
  p.add_argument("--budget", type=float, default=None, help="seconds after which no program starts")
  p.add_argument("--target", default=None, help="run: compile deviceless for h100, h200 or a target file instead")
  p.add_argument("--force", action="store_true", help="install: replace an existing calibration file")
  p.add_argument(
    "--out-dir",
    default=RUN_DIR,
    help="run: the folder (default %(default)s); install: where the calibration file goes (default results/perfmodel)",
  )


def _check(args: argparse.Namespace) -> None:
  if args.action in ("collect", "install") and not args.path:
    raise SystemExit(f"calibrate {args.action}: give the folder (or file) to read")
  if args.action == "install" and args.out_dir == RUN_DIR:  # not given: the model's folder
    args.out_dir = str(PERFMODEL_DIR)
