"""`python -m benchmarks comm`: the bytes one compiled train step moves through collectives, per recipe.

For every (mesh, recipe) it builds the train step of `s3r train` (the same shardings, the
same RULES table), compiles it for the mesh (on CPU: simulated host devices), and sums the
collectives of the per-device program by kind (all-reduce, reduce-scatter, all-gather,
all-to-all, collective-permute) and element type (f32, bf16, s32, s8, ...); see
`labtools.analysis.collectives` for what a collective's "bytes" are. Nothing is executed.

Writes STEM.json (metadata, settings, every collective of every program above `--list-min-kib`)
and STEM.md (the tables), STEM being `--out` (default runs/results/comm; the committed copies are
results/comm.json and results/comm.md). Bad input (a malformed or mismatched mesh, an unknown
recipe or preset, a --batch or --seq that `s3r train` refuses) is one line on stderr and exit
code 2, before anything is compiled. Run:

    python -m benchmarks comm                                  # defaults below, 8 host devices
    python -m benchmarks comm --meshes data=2,fsdp=4 --recipes s3r,s3r_ec

On a CPU-only machine the devices are simulated with
XLA_FLAGS=--xla_force_host_platform_device_count=N, which this command sets itself when
the backend has not started yet. The compiled programs are XLA:CPU's; a GPU or TPU build
partitions the same way (the SPMD partitioner is shared) but may combine, schedule and
decompose collectives differently (e.g. real reduce-scatters where XLA:CPU uses an all-reduce).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
from typing import NoReturn

from labtools.analysis.hlo import hlo_text

DEFAULT_RECIPES = ("bf16", "int8_sr", "s3r", "s3r_ec_dx", "s3r_ec", "s3r_ec+ungathered")
DEFAULT_MESHES = ("data=2,fsdp=4", "data=2,fsdp=2,tensor=2")
DEFAULTS = dict(preset="cpu-small", layers=2, batch=128, seq=128)
KIND_ORDER = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
DTYPE_ORDER = ("f32", "bf16", "s32", "s8")
MIB = 2**20


def ensure_host_devices(n: int) -> None:
  """Asks XLA:CPU for `n` host devices unless the flag is already set (before the backend starts)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


UNGATHERED = "+ungathered"  # suffix of the ablation rows (see `measure`)


def measure(recipe: str, mesh_spec: str, *, preset: str, layers: int | None, batch: int, seq: int) -> dict:
  """The collectives of one compiled train step of `preset` (with `layers` blocks) on `mesh_spec`.

  `recipe + UNGATHERED` (e.g. "s3r_ec+ungathered") is an ablation: the S3R-EC factors and Ŵ
  are not pinned to be gathered (traced inside `s3r.quant.ec.gathered_factors(False)`), so
  XLA chooses the placement itself, as before the factor formulation was enforced.
  """
  if recipe.endswith(UNGATHERED):
    from s3r.quant import ec

    with ec.gathered_factors(False):
      result = measure(recipe.removesuffix(UNGATHERED), mesh_spec, preset=preset, layers=layers, batch=batch, seq=seq)
    return {**result, "recipe": recipe}
  import jax
  import numpy as np

  from labtools.analysis import collectives
  from s3r.model import PRESETS, param_count
  from s3r.train import loop
  from s3r.train.config import TrainConfig

  cfg = TrainConfig(
    out="unused", preset=preset, recipe=recipe, steps=10, warmup=1, batch=batch, seq=seq, mesh=mesh_spec
  )
  overrides = {} if layers is None else {"n_layers": layers}
  setup = loop.build(cfg, PRESETS[preset].vocab_size, loop.make_mesh(cfg), **overrides)
  tokens = jax.ShapeDtypeStruct((batch, seq + 1), np.int32, sharding=setup.batch_sharding)
  t0 = time.time()
  hlo = hlo_text(setup.train_step.lower(setup.abstract_state, tokens, setup.keys["train"]).compile())
  colls = collectives.collectives(hlo)
  return {
    "recipe": recipe,
    "mesh": dict(setup.mesh.shape),
    "mesh_spec": mesh_spec,
    "n_layers": setup.model_cfg.n_layers,
    "param_count": param_count(setup.model_cfg),
    "compile_s": round(time.time() - t0, 2),
    "bytes": collectives.volume(colls),
    "wire_bytes": collectives.volume(colls, wire=True),
    "collectives": [
      {
        "kind": c.kind,
        "dtype": c.dtype,
        "shapes": [list(s) for s in c.shapes],
        "group_size": c.group_size,
        "bytes": c.bytes,
        "op_name": c.op_name,
      }
      for c in colls
    ],
  }


def _mib(x: float) -> str:
  return "" if not x else f"{x / MIB:.3f}"


def _columns(results: list[dict]) -> list[tuple[str, str]]:
  present = {(k, d) for r in results for k, per in r["bytes"].items() for d, b in per.items() if b}
  order = lambda kd: (KIND_ORDER.index(kd[0]), DTYPE_ORDER.index(kd[1]) if kd[1] in DTYPE_ORDER else 99, kd[1])
  return sorted(present, key=order)


def tables_markdown(results: list[dict]) -> str:
  """One table per mesh: MiB per kind x element type, one row per recipe."""
  from labtools.results import markdown_table

  out = []
  for mesh_spec in dict.fromkeys(r["mesh_spec"] for r in results):
    rows = [r for r in results if r["mesh_spec"] == mesh_spec]
    cols = _columns(rows)
    headers = ["recipe"] + [f"{k} {d}" for k, d in cols] + ["total", "sent (ring)"]
    body = []
    for r in rows:
      cells = [r["bytes"].get(k, {}).get(d, 0) for k, d in cols]
      sent = sum(b for per in r["wire_bytes"].values() for b in per.values())
      body.append([f"`{r['recipe']}`"] + [_mib(c) for c in cells] + [_mib(sum(cells)), _mib(sent)])
    shape = "x".join(str(v) for v in rows[0]["mesh"].values())
    out.append(
      f"### mesh {mesh_spec} ({shape} {' x '.join(rows[0]['mesh'])}), MiB per device per step\n\n"
      + markdown_table(headers, body)
    )
    base = next((r for r in rows if r["recipe"] == "s3r"), None)
    deltas = [r for r in rows if r["recipe"].startswith("s3r_ec")]
    if base is not None and deltas:
      cell = lambda r, k, d, base=base: r["bytes"].get(k, {}).get(d, 0) - base["bytes"].get(k, {}).get(d, 0)
      used = [(k, d) for k, d in cols if any(abs(cell(r, k, d)) > 0 for r in deltas)]
      body = [[f"`{r['recipe']}` - `s3r`"] + [f"{cell(r, k, d) / MIB:+.3f}" for k, d in used] for r in deltas]
      out.append(
        "What S3R-EC adds to `s3r` on this mesh (MiB; `+ungathered`: the factors left to XLA's "
        "placement, which reduces weight-sized f32 partials):\n\n"
        + markdown_table(["recipe"] + [f"{k} {d}" for k, d in used], body)
      )
  return "\n".join(out)


def fail(message: str) -> NoReturn:
  """Reports bad input in one line on stderr and exits with 2, before any device or compilation starts."""
  print(f"python -m benchmarks comm: error: {message}", file=sys.stderr, flush=True)
  raise SystemExit(2)


def checked_settings(args: argparse.Namespace) -> tuple[list[str], list[str], int]:
  """(meshes, recipes, devices) of the flags; `fail`s on an unknown recipe or preset, a malformed mesh,
  meshes of different device counts, or a --batch/--seq that `s3r train` would refuse for a mesh."""
  from s3r.quant import RECIPES
  from s3r.train.config import ConfigError, TrainConfig
  from s3r.train.step.sharding import mesh_shape

  meshes = [m.strip() for m in args.meshes.split(";") if m.strip()]
  recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
  if not meshes or not recipes:
    fail("--meshes and --recipes must each name at least one entry")
  if bad := [r for r in recipes if r.removesuffix(UNGATHERED) not in RECIPES]:
    fail(f"--recipes: unknown recipe(s) {', '.join(bad)}; the recipes are {', '.join(RECIPES)}")
  try:
    shapes = {m: mesh_shape(m) for m in meshes}
    for m, shape in shapes.items():
      cfg = TrainConfig(out="unused", preset=args.preset, steps=10, warmup=1, batch=args.batch, seq=args.seq, mesh=m)
      if cfg.batch % (per_batch := shape["data"] * shape["expert"] * shape["fsdp"]):
        fail(f"--batch {cfg.batch} must be divisible by data x expert x fsdp = {per_batch} of the mesh {m}")
  except (ValueError, ConfigError) as e:
    fail(str(e).replace("--mesh ", "--meshes ", 1))
  sizes = {m: math.prod(shape.values()) for m, shape in shapes.items()}
  if len(set(sizes.values())) > 1:
    counts = ", ".join(f"{m} ({n})" for m, n in sizes.items())
    fail(f"--meshes: every mesh must use the same number of devices, got {counts}")
  if args.layers < 0:
    fail(f"--layers must be >= 0 (0: the preset's), got {args.layers}")
  return meshes, recipes, next(iter(sizes.values()))


def run(args: argparse.Namespace) -> dict:
  meshes, recipes, devices = checked_settings(args)
  from s3r.train.step.sharding import MESH_AXES

  ensure_host_devices(devices)
  import jax

  if jax.device_count() != devices:
    fail(
      f"--meshes use {devices} devices but {jax.device_count()} {jax.default_backend()} devices are available "
      f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})"
    )
  from labtools.results import run_metadata

  meta = run_metadata()
  settings = {
    "preset": args.preset,
    "layers": args.layers,
    "batch": args.batch,
    "seq": args.seq,
    "meshes": meshes,
    "recipes": recipes,
    "mesh_axes": list(MESH_AXES),
  }
  results = []
  for mesh_spec in meshes:
    for recipe in recipes:
      r = measure(recipe, mesh_spec, preset=args.preset, layers=args.layers or None, batch=args.batch, seq=args.seq)
      print(
        f"{mesh_spec:<24} {recipe:<10} "
        + ", ".join(f"{k} {d} {b / MIB:.3f} MiB" for k, per in r["bytes"].items() for d, b in per.items()),
        file=sys.stderr,
        flush=True,
      )
      r["collectives"] = [c for c in r["collectives"] if c["bytes"] >= args.list_min_kib * 1024]
      results.append(r)
  doc = {"meta": meta, "settings": settings, "results": results}
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
  out.with_suffix(".md").write_text(report_markdown(doc))
  print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", file=sys.stderr)
  return doc


def report_markdown(doc: dict) -> str:
  meta, s = doc["meta"], doc["settings"]
  git = meta.get("git") or {}
  head = [
    "# Collective communication of one train step (`python -m benchmarks comm`)",
    "",
    f"- command: `{meta.get('command')}`",
    f"- git: `{git.get('revision')}`{' (dirty work tree)' if git.get('dirty') else ''}",
    f"- date (UTC): {meta.get('date_utc')}; jax {meta.get('jax_version')}, jaxlib {meta.get('jaxlib_version')}",
    f"- machine: {meta.get('platform')} ({meta.get('device_count')} {meta.get('device_kind')} devices), "
    f"{meta.get('cpu_model')}, host {meta.get('hostname')}",
    f"- model: preset `{s['preset']}` with {s['layers'] or 'its'} layers, global batch {s['batch']} x seq {s['seq']}",
    "",
    "Bytes per device of the compiled (SPMD-partitioned) train step: the full buffer of each "
    "collective (the all-reduced array, the gathered result, the reduce-scatter operand), summed by "
    'kind and element type; "sent (ring)" is what one device sends with ring algorithms (2(n-1)/n of an '
    "all-reduced buffer, (n-1)/n of a gathered or scattered one). Nothing is run; see "
    "`labtools/analysis/collectives.py` and docs/scaling.md.",
    "",
    "",
  ]
  return "\n".join(head) + tables_markdown(doc["results"])


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--preset", default=DEFAULTS["preset"], help="model preset")
  p.add_argument("--layers", type=int, default=DEFAULTS["layers"], help="number of blocks (0: the preset's)")
  p.add_argument("--batch", type=int, default=DEFAULTS["batch"], help="global batch (sequences)")
  p.add_argument("--seq", type=int, default=DEFAULTS["seq"], help="tokens per sequence")
  p.add_argument("--meshes", default=";".join(DEFAULT_MESHES), help="';'-separated meshes, e.g. 'data=2,fsdp=4;fsdp=8'")
  p.add_argument(
    "--recipes",
    default=",".join(DEFAULT_RECIPES),
    help=f"comma-separated recipes; NAME{UNGATHERED} (S3R-EC recipes) is the ablation in which XLA "
    "places the S3R-EC factors freely instead of gathering them",
  )
  p.add_argument("--out", default="runs/results/comm", help="output stem: writes STEM.json and STEM.md")
  p.add_argument(
    "--list-min-kib",
    type=float,
    default=64.0,
    help="keep the individual collectives of at least this many KiB in the JSON",
  )
