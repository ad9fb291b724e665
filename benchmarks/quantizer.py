"""`python -m benchmarks quantizer`: the backward gradient quantizer alone, per recipe, against a memory floor.

Input: an upstream gradient G bf16 [T, N] with the saved per-token scale s_x [T] and
per-channel scale s_w [N]. Output: what the backward GEMMs consume, i.e. the int8 codes Q
(one Q shared by both products; two independent Qs for int8_sr) and the step Δ, plus the
S3R-EC error factors r [T], c [N], m (s3r_ec and s3r_ec_dx build the same factors; they
differ only in how the GEMM outputs are corrected). It runs the same steps as the backward
of `s3r.qmatmul` (`s3r.quant.quantize_gradient`: G' = s_x G s_w, Δ = max|G'|/127,
the recipe's rounding) and `s3r.quant.ec.error_factors`.

Floors measured in the same run:
  floor      one pass reading G and writing one int8 per element (`g.astype(int8)`),
             the memory-bound minimum of any quantizer;
  floor_2pass  the same plus the read-only global max |G| pass that any per-tensor step
             needs (`(g * (127 / max|g|)).astype(int8)`, the max fed through an
             optimization_barrier so that XLA:CPU fuses it into one read of G): the minimum
             with a per-tensor Δ.
Ratios: time / floor, time / floor_2pass, time / int8_rtne; GB/s counts 2 bytes read +
1 byte written per element and Q written (twice for int8_sr).
"""

from __future__ import annotations

import argparse
import functools

from benchmarks import options, timing
from labtools.results import RESULTS_DIR, Run, bar_chart, fmt_ratio, loadavg, log, markdown_table, parse_list

DEFAULT_SHAPES = "W1,W2,W3,W4"
DEFAULT_RECIPES = "int8_rtne,int8_sr,s3r,s3r_ec,s3r_ec_dx"
DEFAULT_TOKENS = 2048
FLOORS = ("floor", "floor_2pass")


def config_names(recipes) -> list[str]:
  """The configurations one run times, in table order: the two floors, then the recipes."""
  return [*FLOORS, *recipes]


def quantize_gradient(recipe, g_BxSxN, sx_BxS, sw_N, key):
  """The recipe's backward quantizer: `s3r.quant.quantize_gradient`, what the backward calls.

  Returns (q_dx int8, q_dw int8 or None when shared, Δ, (r, c, m) or None when uncorrected).
  """
  import jax.numpy as jnp

  from s3r.quant import ec
  from s3r.quant import quantize_gradient as core_quantize_gradient
  from s3r.quant.recipes import recipe as get_recipe

  r = get_recipe(recipe)
  delta, v, q_dx, q_dw = core_quantize_gradient(r, sx_BxS, sw_N, g_BxSxN, key)
  factors = ec.error_factors(q_dx.astype(jnp.float32) - v) if (r.correct_dx or r.correct_dw) else None
  return (q_dx, q_dw if r.split else None, delta, factors)


def make_quantizer(name: str):
  """Jitted (g [T, N] bf16, s_x [T], s_w [N], key) -> outputs, for a recipe or a floor."""
  import jax
  import jax.numpy as jnp

  if name == "floor":
    return jax.jit(lambda g, sx, sw, key: g.astype(jnp.int8))
  if name == "floor_2pass":

    def floor_2pass(g, sx, sw, key):
      # The barrier gives the max its own copy of g, so that XLA:CPU fuses abs+max into one
      # read-only pass over bf16 G instead of materializing |G| for a separate reduction.
      amax = jnp.max(jnp.abs(jax.lax.optimization_barrier(g)))
      return (g * (127.0 / amax)).astype(jnp.int8)

    return jax.jit(floor_2pass)

  def quant(g, sx, sw, key):
    return quantize_gradient(name, g[None], sx[None], sw, key)

  return jax.jit(quant)


def make_inputs(tokens: int, n: int, seed: int = 0):
  import jax
  import jax.numpy as jnp

  k = jax.random.split(jax.random.key(seed), 4)
  g = (jax.random.normal(k[0], (tokens, n), jnp.float32) * 1e-3).astype(jnp.bfloat16)
  sx = jax.random.uniform(k[1], (tokens,), jnp.float32, 0.01, 0.05)
  sw = jax.random.uniform(k[2], (n,), jnp.float32, 0.001, 0.005)
  return g, sx, sw, k[3]


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--shapes",
    default=DEFAULT_SHAPES,
    help=f"paper shapes W1..W9, 'all' or custom HxD (e.g. 256x1024); the gradient is G [T, D_ffn] "
    f"(default {DEFAULT_SHAPES})",
  )
  p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="tokens T (default %(default)s)")
  p.add_argument(
    "--recipes",
    default=DEFAULT_RECIPES,
    help="comma-separated INT8 recipes (default %(default)s); the floors are always timed",
  )
  p.add_argument(
    "--repeats", type=int, default=15, help="timed samples per configuration, interleaved (default %(default)s)"
  )
  p.add_argument(
    "--number", type=int, default=3, help="back-to-back calls averaged in one sample (default %(default)s)"
  )
  p.add_argument("--warmup", type=int, default=2, help="untimed calls after the compiling call (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default %(default)s)")
  p.add_argument(
    "--out-dir",
    default=str(RESULTS_DIR),
    help="where bench_quantizer_<platform>.{json,md,png} go (default %(default)s)",
  )
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES

  shapes = options.parse_shapes(args.shapes)
  quantized = [n for n, r in RECIPES.items() if r.quantized]
  recipes = parse_list(args.recipes, quantized, "INT8 recipes")
  names = config_names(recipes)
  run_ = Run(
    "quantizer",
    args.out_dir,
    shapes=",".join(shapes),
    tokens=args.tokens,
    recipes=",".join(recipes),
    repeats=args.repeats,
    number=args.number,
    warmup=args.warmup,
    seed=args.seed,
  )
  results = []
  for shape in shapes:
    _, n = shapes[shape]
    log(f"[quantizer] {shape}: G [{args.tokens}, {n}], load {loadavg()}")
    inputs = make_inputs(args.tokens, n, args.seed)
    configs = {name: (make_quantizer(name), inputs) for name in names}
    timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=args.warmup, number=args.number)
    del configs, inputs
    results.append(_summarize(shape, args.tokens, n, timings))
    log("  " + ", ".join(f"{k} {t.median * 1e3:.2f} ms" for k, t in timings.items()))
    run_.write(results, markdown(results, names), complete=False)  # a run cut short keeps its shapes
  paths = run_.write(
    results, markdown(results, names), chart=None if args.no_chart else functools.partial(chart, results, names)
  )
  log(f"[quantizer] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def _summarize(shape, tokens, n, timings) -> dict:
  from s3r import RECIPES

  elems = tokens * n
  rows = {}
  for name, t in timings.items():
    q_count = 2 if (name in RECIPES and RECIPES[name].split) else 1
    bytes_moved = elems * (2 + q_count)
    row = {
      "timing": t.as_dict(),
      "q_tensors": q_count,
      "gb_per_s": bytes_moved / t.median / 1e9,
      "ns_per_element": t.median / elems * 1e9,
    }
    for ref in ("floor", "floor_2pass", "int8_rtne"):
      if ref in timings:
        row[f"time_vs_{ref}"] = t.median / timings[ref].median
        row[f"time_vs_{ref}_paired"] = timing.paired_ratio(t, timings[ref])
    rows[name] = row
  return {"shape": shape, "tokens": tokens, "n": n, "elements": elems, "configs": rows}


def markdown(results, names) -> str:
  out = ["## Backward quantizer alone: G bf16 [T, N] -> int8 Q (median ms; ratios from the same run)", ""]
  head = [
    "shape",
    "G [T, N]",
    "config",
    "median ms",
    "IQR ms",
    "ns/elem",
    "GB/s",
    "x floor",
    "x floor_2pass",
    "x int8_rtne",
  ]
  rows = []
  for res in results:
    for name in names:
      row = res["configs"][name]
      t = row["timing"]
      rows.append(
        [
          res["shape"],
          f"[{res['tokens']}, {res['n']}]",
          name,
          f"{t['median_s'] * 1e3:.2f}",
          f"{t['iqr_s'] * 1e3:.2f}",
          f"{row['ns_per_element']:.2f}",
          f"{row['gb_per_s']:.1f}",
          fmt_ratio(row.get("time_vs_floor")),
          fmt_ratio(row.get("time_vs_floor_2pass")),
          fmt_ratio(row.get("time_vs_int8_rtne")),
        ]
      )
  out.append(markdown_table(head, rows, align=["l", "l", "l"] + ["r"] * 7))
  out += [
    "",
    "floor: `g.astype(int8)` (read G once, write int8 once); floor_2pass: adds the read-only global "
    "max|G| pass a per-tensor step needs (fused, G not materialized). "
    "s3r_ec / s3r_ec_dx also output the EC factors r, c, m.",
    "",
  ]
  return "\n".join(out)


def chart(results, names, path) -> None:
  groups = [r["shape"] for r in results]
  series = {n: [r["configs"][n].get("time_vs_floor") for r in results] for n in names}
  bar_chart(
    path,
    groups,
    series,
    ylabel="time / memory floor",
    hline=1.0,
    title="Backward quantizer alone: time relative to g.astype(int8)",
  )
