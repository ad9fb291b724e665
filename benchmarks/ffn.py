"""`python -m benchmarks ffn`: one SwiGLU FFN block, forward + backward, per recipe (the paper's Table III).

y = down(silu(gate(x)) * up(x)) with x [T, H] (bf16), gate and up [H, D_ffn], down [D_ffn, H]
(f32 master weights, as in training). All three projections go through `s3r.qmatmul` with
the recipe, each with its own key split from one key. The timed function is the VJP of the
block with a random bf16 upstream gradient: it returns dX and the three weight gradients.

Every recipe of one shape is compiled and warmed up, then the repeats are interleaved; the
table reports medians and the ratios of medians of the same run:
  speedup vs bf16    = t(bf16) / t(recipe)      (> 1: faster than BF16; the paper's Table III)
  speedup vs int8_sr = t(int8_sr) / t(recipe)
  vs int8_rtne       = t(recipe) / t(int8_rtne) (1.00 = as fast as round-to-nearest)
  EC overhead        = t(s3r_ec*) / t(s3r) - 1  (the paper's "+%" columns)

Run the larger paper shapes with e.g. `--shapes W5,W6,W7,W8,W9 --tokens 256 --repeats 3`
(they need several GB of memory and tens of seconds per call on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import numpy as np

from benchmarks import options, timing
from labtools import paper
from labtools.results import RESULTS_DIR, Run, bar_chart, fmt_ms, fmt_ratio, loadavg, log, markdown_table, parse_list

DEFAULT_SHAPES = "W1,W2,W3,W4"


def make_ffn(recipe: str):
  """The SwiGLU block f(x, wg, wu, wd, key) -> y with every projection through s3r.qmatmul."""
  import jax

  from s3r import qmatmul

  def ffn(x, wg, wu, wd, key):
    kg, ku, kd = jax.random.split(key, 3)
    g = qmatmul(x, wg, key=kg, recipe=recipe)
    u = qmatmul(x, wu, key=ku, recipe=recipe)
    h = jax.nn.silu(g) * u
    return qmatmul(h, wd, key=kd, recipe=recipe)

  return ffn


def fwd_bwd_of(block):
  """Jitted (x, wg, wu, wd, dy, key) -> (dx, dwg, dwu, dwd) for block(x, wg, wu, wd, key)."""
  import jax

  @jax.jit
  def fwd_bwd(x, wg, wu, wd, dy, key):
    _, vjp = jax.vjp(lambda *a: block(*a, key), x, wg, wu, wd)
    return vjp(dy)

  return fwd_bwd


def make_fwd_bwd(recipe: str):
  """The forward and VJP of the recipe's FFN block (see `fwd_bwd_of`)."""
  return fwd_bwd_of(make_ffn(recipe))


def make_inputs(tokens: int, hidden: int, ffn_dim: int, seed: int = 0, examples: int = 1):
  """(x, wg, wu, wd, dy, key): bf16 activations and upstream gradient, f32 weights (≈ init scale)."""
  import jax
  import jax.numpy as jnp

  ks = jax.random.split(jax.random.key(seed), 6)
  lead = (tokens,) if examples == 1 else (examples, tokens // examples)
  x = jax.random.normal(ks[0], (*lead, hidden), jnp.float32).astype(jnp.bfloat16)
  wg = jax.random.normal(ks[1], (hidden, ffn_dim), jnp.float32) / np.sqrt(hidden)
  wu = jax.random.normal(ks[2], (hidden, ffn_dim), jnp.float32) / np.sqrt(hidden)
  wd = jax.random.normal(ks[3], (ffn_dim, hidden), jnp.float32) / np.sqrt(ffn_dim)
  dy = (jax.random.normal(ks[4], (*lead, hidden), jnp.float32) / tokens).astype(jnp.bfloat16)
  return x, wg, wu, wd, dy, ks[5]


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--shapes",
    default=DEFAULT_SHAPES,
    help=f"comma-separated paper shapes W1..W9, 'all', or custom HxD such as 256x1024 (default {DEFAULT_SHAPES}; "
    "(H, D_ffn): " + ", ".join(f"{k}={v}" for k, v in paper.FFN_SHAPES.items()) + ")",
  )
  p.add_argument(
    "--tokens",
    type=int,
    default=None,
    help="tokens T per call for every shape (default per shape: "
    + ", ".join(f"{k}:{v}" for k, v in options.DEFAULT_TOKENS.items())
    + ")",
  )
  p.add_argument(
    "--examples",
    type=int,
    default=1,
    help="split the T tokens into this many examples, x [B, T/B, H] (default 1: x [T, H])",
  )
  p.add_argument(
    "--recipes",
    default=",".join(options.BENCH_RECIPES),
    help="comma-separated recipes (default %(default)s); any name in s3r.RECIPES",
  )
  p.add_argument("--repeats", type=int, default=5, help="timed calls per recipe, interleaved (default %(default)s)")
  p.add_argument(
    "--number",
    type=int,
    default=1,
    help="back-to-back calls averaged in one sample (default %(default)s; raise it on a GPU, "
    "where one small call is shorter than its dispatch)",
  )
  p.add_argument("--warmup", type=int, default=1, help="untimed calls after the compiling call (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default %(default)s)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_ffn_<platform>.{json,md,png} go (default %(default)s)"
  )
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES

  shapes = options.parse_shapes(args.shapes)
  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  run_ = Run(
    "ffn",
    args.out_dir,
    shapes=",".join(shapes),
    tokens=args.tokens,
    examples=args.examples,
    recipes=",".join(recipes),
    repeats=args.repeats,
    number=args.number,
    warmup=args.warmup,
    seed=args.seed,
  )
  results = []
  for shape in shapes:
    hidden, ffn_dim = shapes[shape]
    tokens = options.tokens_for(shape, args.tokens)
    if tokens % args.examples:
      raise SystemExit(f"--examples {args.examples} must divide the token count {tokens}")
    log(f"[ffn] {shape} (H={hidden}, D_ffn={ffn_dim}), T={tokens}, load {loadavg()}")
    inputs = make_inputs(tokens, hidden, ffn_dim, args.seed, args.examples)
    configs = {r: (make_fwd_bwd(r), inputs) for r in recipes}
    timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=args.warmup, number=args.number, log=log)
    del configs, inputs
    results.append(_summarize(shape, hidden, ffn_dim, tokens, timings))
    log("  " + ", ".join(f"{r} {t.median * 1e3:.1f} ms" for r, t in timings.items()))
    run_.write(results, markdown(results, recipes), complete=False)  # a run cut short keeps its shapes
  paths = run_.write(
    results, markdown(results, recipes), chart=None if args.no_chart else functools.partial(chart, results, recipes)
  )
  log(f"[ffn] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def _summarize(shape, hidden, ffn_dim, tokens, timings: dict[str, timing.Timing]) -> dict:
  def ratio(a, b):  # t(a) / t(b) as ratio of medians and as paired (per-round) median
    if a not in timings or b not in timings:
      return None, None
    return timings[a].median / timings[b].median, timing.paired_ratio(timings[a], timings[b])

  rows = {}
  for r, t in timings.items():
    row: dict[str, Any] = {"timing": t.as_dict()}
    for ref in ("bf16", "int8_sr"):
      med, paired = ratio(ref, r)
      row[f"speedup_vs_{ref}"], row[f"speedup_vs_{ref}_paired"] = med, paired
    med, paired = ratio(r, "int8_rtne")
    row["time_vs_int8_rtne"], row["time_vs_int8_rtne_paired"] = med, paired
    if r.startswith("s3r_ec"):
      med, paired = ratio(r, "s3r")
      row["overhead_vs_s3r_pct"] = None if med is None else 100 * (med - 1)
      row["overhead_vs_s3r_pct_paired"] = None if paired is None else 100 * (paired - 1)
    rows[r] = row
  flops = 3 * 3 * 2 * tokens * hidden * ffn_dim  # three projections, fwd + two bwd products each
  return {"shape": shape, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": tokens, "gemm_flops": flops, "recipes": rows}


def markdown(results: list[dict], recipes: list[str]) -> str:
  out = ["## One SwiGLU FFN block, forward + backward (median ms; speedups from the same run)", ""]
  head = [
    "shape",
    "(H, D_ffn)",
    "T",
    "recipe",
    "median ms",
    "IQR ms",
    "speedup vs bf16",
    "speedup vs int8_sr",
    "time / int8_rtne",
    "EC overhead vs s3r",
  ]
  rows = []
  for res in results:
    for r in recipes:
      row = res["recipes"][r]
      t = row["timing"]
      ov = row.get("overhead_vs_s3r_pct")
      rows.append(
        [
          res["shape"],
          f"({res['hidden']}, {res['ffn_dim']})",
          res["tokens"],
          r,
          fmt_ms(t["median_s"]),
          fmt_ms(t["iqr_s"]),
          fmt_ratio(row["speedup_vs_bf16"]),
          fmt_ratio(row["speedup_vs_int8_sr"]),
          fmt_ratio(row["time_vs_int8_rtne"]),
          "" if ov is None else f"{ov:+.1f}%",
        ]
      )
  out.append(markdown_table(head, rows))
  out += ["", "Ratios are ratios of medians; the JSON also has the paired (per-round) medians.", ""]
  ref = [res for res in results if res["shape"] in paper.PAPER_TABLE_III]
  if ref:
    out += ["## Reference: paper Table III (TPU v5p), speed vs BF16 and S3R-EC overhead over S3R", ""]
    rows = []
    for res in ref:
      p = paper.PAPER_TABLE_III[res["shape"]]
      rows.append(
        [
          res["shape"],
          f"{p['int8_rtne']:.2f}",
          f"{p['int8_sr']:.2f}",
          f"{p['s3r']:.2f}",
          f"{p['s3r_ec_pct']:+.1f}%",
          f"{p['s3r_ec_dx_pct']:+.1f}%",
        ]
      )
    out.append(markdown_table(["shape", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx"], rows))
  return "\n".join(out)


def chart(results: list[dict], recipes: list[str], path) -> None:
  groups = [f"{r['shape']}\nT={r['tokens']}" for r in results]
  series = {rc: [r["recipes"][rc]["speedup_vs_bf16"] for r in results] for rc in recipes}
  bar_chart(
    path,
    groups,
    series,
    ylabel="speedup vs bf16 (t_bf16 / t)",
    hline=1.0,
    title="SwiGLU FFN block fwd+bwd: speed vs BF16 (same run)",
  )
