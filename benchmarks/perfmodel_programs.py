"""Programs compiled for the performance model: the FFN block and the gradient quantizer of any revision of s3r.

`python -m benchmarks perfmodel compile --s3r-root DIR` imports the library from DIR (a checkout of the
revision that was measured: `git worktree add DIR REV`), builds the FFN block of that revision's benchmark
(`s3r.bench.ffn` in older trees, `benchmarks.ffn` now) or its quantizer programs (`s3r.bench.quantizer`),
lowers them from abstract arguments on the target's compile-only devices and writes each program's optimized
HLO to `--hlo-dir` as `<target>_<program>_<shape>_T<tokens>_<recipe>.hlo.gz`. Only jax and the chosen
library are imported, so an old revision compiles with today's tooling.
"""

from __future__ import annotations

import gzip
import importlib
import pathlib
import sys
import time

from benchmarks import aot_targets
from labtools.paper import FFN_SHAPES
from labtools.results import log

QUANTIZER_NAMES = ("floor", "floor_2pass", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")


def use_library(root: str | None) -> pathlib.Path:
  """Imports s3r from `root` (a checkout) instead of this one; returns where s3r was imported from."""
  if root:
    path = pathlib.Path(root).resolve()
    if not (path / "s3r" / "__init__.py").is_file():
      raise SystemExit(f"--s3r-root {root}: no s3r package there")
    for name in [m for m in sys.modules if m == "s3r" or m.startswith("s3r.")]:
      del sys.modules[name]
    sys.path.insert(0, str(path))
  import s3r

  where = pathlib.Path(s3r.__file__).resolve().parents[1]
  if root and where != pathlib.Path(root).resolve():
    raise SystemExit(f"--s3r-root {root}: s3r was imported from {where} instead")
  return where


def _module(old: str, new: str):
  try:
    return importlib.import_module(old)
  except ModuleNotFoundError:
    return importlib.import_module(new)


def compile_programs(
  target: str, program: str, recipes: list[str], shapes: list[str], tokens: int, hlo_dir: pathlib.Path, options: dict
) -> list[dict]:
  """Compiles `program` (ffn or quantizer) at each shape and recipe; writes the HLO; returns one row each."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding

  device = aot_targets.target_devices(target)[0]
  sharding = SingleDeviceSharding(device)
  array = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding)
  rows = []
  for shape in shapes:
    hidden, ffn_dim = FFN_SHAPES[shape]
    for recipe in recipes:
      if program == "ffn":
        fn = _module("s3r.bench.ffn", "benchmarks.ffn").make_fwd_bwd(recipe)
        args = (array((tokens, hidden), jnp.bfloat16), array((hidden, ffn_dim), jnp.float32),
                array((hidden, ffn_dim), jnp.float32), array((ffn_dim, hidden), jnp.float32),
                array((tokens, hidden), jnp.bfloat16), key)  # fmt: skip
      else:
        fn = _module("s3r.bench.quantizer", "benchmarks.quantizer").make_quantizer(recipe)
        args = (
          array((tokens, ffn_dim), jnp.bfloat16),
          array((tokens,), jnp.float32),
          array((ffn_dim,), jnp.float32),
          key,
        )
      t0 = time.perf_counter()
      compiled = fn.lower(*args).compile(compiler_options=options)
      name = f"{target}_{program}_{shape}_T{tokens}_{recipe}"
      (hlo_dir / f"{name}.hlo.gz").write_bytes(gzip.compress(compiled.as_text().encode(), mtime=0))
      rows.append({"program": program, "shape": shape, "tokens": tokens, "recipe": recipe, "hlo": f"{name}.hlo.gz"})
      log(f"[perfmodel] {name}: compiled in {time.perf_counter() - t0:.1f}s")
  return rows


def run_compile(args) -> None:
  tpu = aot_targets.is_tpu(args.target)
  installed = aot_targets.tpu_plugin_installed() if tpu else aot_targets.cuda_plugin_installed()
  if not installed:
    raise SystemExit(aot_targets.MISSING_TPU_EXTRA if tpu else aot_targets.MISSING_EXTRA)
  aot_targets.use_cpu_host()
  where = use_library(args.s3r_root)
  log(f"[perfmodel] s3r from {where}")
  hlo_dir = pathlib.Path(args.hlo_dir)
  hlo_dir.mkdir(parents=True, exist_ok=True)
  options = {} if tpu else {"xla_gpu_autotune_level": 0}
  recipes = [r for r in args.recipes.split(",") if r]
  shapes = [s for s in args.shapes.split(",") if s]
  unknown = [s for s in shapes if s not in FFN_SHAPES]
  if unknown:
    raise SystemExit(f"--shapes: unknown {', '.join(unknown)} (of {', '.join(FFN_SHAPES)})")
  rows = compile_programs(args.target, args.program, recipes, shapes, args.tokens, hlo_dir, options)
  _record(hlo_dir, where, args, rows)


def _record(hlo_dir: pathlib.Path, where: pathlib.Path, args, rows: list[dict]) -> None:
  """Appends what was compiled, from which revision of s3r and by which command, to hlo_dir/manifest.json."""
  import json
  import subprocess

  from labtools.results import run_metadata

  git = lambda *a: subprocess.run(["git", "-C", str(where), *a], capture_output=True, text=True).stdout.strip()
  entry = {"target": args.target, "program": args.program, "tokens": args.tokens, "programs": [r["hlo"] for r in rows],
           "s3r_revision": git("rev-parse", "HEAD"), "s3r_dirty": bool(git("status", "--porcelain", "--", "s3r")),
           "made_by": run_metadata()}  # fmt: skip
  path = hlo_dir / "manifest.json"
  entries = json.loads(path.read_text()) if path.is_file() else []
  path.write_text(json.dumps([*entries, entry], indent=1) + "\n")
