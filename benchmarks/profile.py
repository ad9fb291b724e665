"""`python -m benchmarks profile`: where the time of the FFN block fwd+bwd goes, per compiled fusion.

Traces a few calls of the SwiGLU block (as in `python -m benchmarks ffn`) with `jax.profiler`, reads
the XLA:CPU per-thunk events back from the trace (`--xla_cpu_enable_xprof_traceme`, set by
this command before JAX starts its CPU backend), and attributes their CPU time (summed
over threads, so it can exceed the wall time) to the fusions of the optimized HLO. Each
fusion is described by its output shape, the ops inside it and its operand shapes, and put
in a category: int8 GEMM (a dot), reduction, elementwise on [H, D_ffn] (weight-sized),
[T, D_ffn] or [T, H] arrays (labels joined by '=' when sizes coincide, e.g. T = H), other.
Use it to compare recipes on the same shape (e.g. `--recipes s3r,s3r_ec_dx`): the rows that
only one recipe has are its extra cost.

Relies on jax's private `jax._src.lib._profile_data` reader; on other backends the event
names may not match the HLO and the table stays empty.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import tempfile

from benchmarks import options
from labtools.analysis import hlo
from labtools.analysis.hlo import hlo_text
from labtools.results import RESULTS_DIR, Run, log, markdown_table, parse_list

TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
_SIZE_LABELS = {"weight": "[H,D]", "t_d": "[T,D]", "t_h": "[T,H]"}


def enable_traceme() -> bool:
  """Adds the per-thunk trace flag to XLA_FLAGS; True if the CPU backend is not yet created."""
  flags = os.environ.get("XLA_FLAGS", "")
  if TRACEME_FLAG not in flags:
    os.environ["XLA_FLAGS"] = (flags + " " + TRACEME_FLAG).strip()
  try:
    from jax._src import xla_bridge

    return not xla_bridge._backends  # noqa: SLF001 - flags are read when the backend is created
  except (ImportError, AttributeError):
    return True


def describe_fusions(hlo_text: str, sizes: dict[str, int]) -> dict[str, dict]:
  """Top-level instruction name -> {shape, ops, operands, category} for fusions and calls."""
  comps = hlo.parse_hlo(hlo_text)
  out = {}
  for c in comps.values():
    for ins in c.instrs:
      if ins.opcode in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
        continue
      m = re.search(r"calls=%([\w.\-]+)", ins.attrs)
      ops, params = collections.Counter(), []
      if m and m.group(1) in comps:
        body = comps[m.group(1)].instrs
        ops = collections.Counter(
          i.opcode
          for i in body
          if i.opcode not in ("parameter", "constant", "bitcast", "broadcast", "reshape", "tuple", "get-tuple-element")
        )
        params = [f"{i.dtype}{list(i.dims)}" for i in body if i.opcode == "parameter"]
      elif ins.opcode not in ("fusion",):
        ops = collections.Counter([ins.opcode])
      elems = ins.elements
      if "dot" in ops or "convolution" in ops:
        cat = "int8 GEMM" if ins.dtype == "s32" else "GEMM"
      elif "reduce" in ops or "reduce-window" in ops:
        cat = "reduction"
      elif elems and elems in sizes.values():
        cat = "elementwise " + "=".join(_SIZE_LABELS[k] for k, v in sizes.items() if v == elems)
      else:
        cat = "other"
      out[ins.name] = {
        "shape": f"{ins.dtype}{list(ins.dims)}" if ins.dtype else "tuple",
        "ops": " ".join(f"{k}" + (f"x{v}" if v > 1 else "") for k, v in ops.most_common(8)),
        "operands": params[:5],
        "category": cat,
      }
  return out


def profile_call(fn, args, iters: int) -> tuple[dict[str, float], float]:
  """Per-event CPU seconds per call and wall seconds per call of `iters` traced calls."""
  import jax
  from jax._src.lib import _profile_data

  for _ in range(2):
    jax.block_until_ready(fn(*args))
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(iters):
        jax.block_until_ready(fn(*args))
    paths = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".xplane.pb")]
    data = _profile_data.ProfileData.from_file(paths[0])
    tot: collections.Counter = collections.Counter()
    wall = 0
    for plane in data.planes:
      for line in plane.lines:
        for ev in line.events:
          tot[ev.name] += ev.duration_ns
          if "block_until_ready" in ev.name:
            wall += ev.duration_ns
  return {k: v / iters / 1e9 for k, v in tot.items()}, wall / iters / 1e9


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--shape", default="W3", help="paper shape W1..W9 or HxD (default %(default)s)")
  p.add_argument("--tokens", type=int, default=None, help="tokens T (default: the ffn bench's per-shape default)")
  p.add_argument("--recipes", default="int8_rtne,s3r,s3r_ec_dx", help="comma-separated recipes (default %(default)s)")
  p.add_argument("--iters", type=int, default=3, help="traced calls per recipe (default %(default)s)")
  p.add_argument("--top", type=int, default=25, help="fusions listed per recipe (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default %(default)s)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_profile_<platform>.{json,md} go (default %(default)s)"
  )


def run(args: argparse.Namespace) -> dict:
  if not enable_traceme():
    log(f"[profile] warning: the JAX backend already exists; set XLA_FLAGS={TRACEME_FLAG} before starting")
  from benchmarks import ffn
  from s3r import RECIPES

  ((label, (hidden, ffn_dim)),) = options.parse_shapes(args.shape).items()
  tokens = options.tokens_for(label, args.tokens)
  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  run_ = Run("profile", args.out_dir, shape=label, tokens=tokens, recipes=",".join(recipes), iters=args.iters)
  inputs = ffn.make_inputs(tokens, hidden, ffn_dim, args.seed)
  sizes = {"weight": hidden * ffn_dim, "t_d": tokens * ffn_dim, "t_h": tokens * hidden}
  results = {}
  for r in recipes:
    log(f"[profile] {label} T={tokens}: {r}")
    fn = ffn.make_fwd_bwd(r)
    desc = describe_fusions(hlo_text(fn.lower(*inputs).compile()), sizes)
    times, wall = profile_call(fn, inputs, args.iters)
    rows = sorted(((n, t) for n, t in times.items() if n in desc), key=lambda kv: -kv[1])
    total = sum(t for _, t in rows)
    cats: collections.defaultdict[str, float] = collections.defaultdict(float)
    for n, t in rows:
      cats[desc[n]["category"]] += t
    results[r] = {
      "wall_s": wall,
      "thunk_cpu_s": total,
      "categories": dict(cats),
      "fusions": [{"name": n, "cpu_s": t, **desc[n]} for n, t in rows],
    }
  paths = run_.write(
    {"shape": label, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": tokens, "recipes": results},
    markdown(label, hidden, ffn_dim, tokens, results, args.top),
  )
  log(f"[profile] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def markdown(label, hidden, ffn_dim, tokens, results, top) -> str:
  out = [
    f"## Per-fusion CPU time, SwiGLU FFN fwd+bwd at {label} (H={hidden}, D_ffn={ffn_dim}), T={tokens}",
    "",
    "CPU time summed over threads, per call (ms). Categories:",
    "",
  ]
  cats = sorted({c for r in results.values() for c in r["categories"]})
  rows = [
    [
      r,
      f"{v['wall_s'] * 1e3:.1f}",
      f"{v['thunk_cpu_s'] * 1e3:.1f}",
      *[f"{v['categories'].get(c, 0) * 1e3:.1f}" for c in cats],
    ]
    for r, v in results.items()
  ]
  out.append(markdown_table(["recipe", "wall ms", "thunk CPU ms", *cats], rows))
  for r, v in results.items():
    out += ["", f"### {r}: top {top} fusions", ""]
    rows = [
      [
        f["name"],
        f"{f['cpu_s'] * 1e3:.2f}",
        f"{100 * f['cpu_s'] / v['thunk_cpu_s']:.1f}%",
        f["category"],
        f["shape"],
        f["ops"],
        ", ".join(f["operands"]),
      ]
      for f in v["fusions"][:top]
    ]
    out.append(
      markdown_table(
        ["fusion", "CPU ms", "share", "category", "output", "ops inside", "operands"],
        rows,
        align=["l", "r", "r", "l", "l", "l", "l"],
      )
    )
  return "\n".join(out) + "\n"
