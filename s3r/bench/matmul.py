"""One quantized linear layer, forward + backward: x [T, K] @ w [K, N] per recipe.

The core-level speed check (issue: the s3r_ec_dx layer must be no slower than bf16 and at
least 1.5x faster than independent SR). Each recipe returns y, dX and dW for a random bf16
upstream gradient; repeats are interleaved and ratios are taken within the run.
"""

from __future__ import annotations

import argparse

from s3r.bench import common

RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec_dx", "s3r_ec")


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--shape", default="2048,1024,4096", help="T,K,N: tokens, input and output features")
  p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipes")
  p.add_argument("--repeats", type=int, default=9, help="interleaved timed rounds")
  p.add_argument("--out", default=None, help="results folder (default results/)")


def run(args: argparse.Namespace) -> dict:
  import jax
  import jax.numpy as jnp

  import s3r

  try:
    t, k, n = (int(v) for v in args.shape.split(","))
  except ValueError:
    raise SystemExit(f"s3r bench matmul: --shape must be T,K,N (three integers), got {args.shape!r}") from None
  recipes = common.parse_list(args.recipes, list(s3r.RECIPES), "recipe")
  run_ = common.Run("matmul", args.out, shape=[t, k, n], recipes=recipes, repeats=args.repeats)
  x = jax.random.normal(jax.random.key(0), (t, k), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (k, n), jnp.float32) * 0.02
  g = jax.random.normal(jax.random.key(2), (t, n), jnp.bfloat16)
  key = jax.random.key(3)

  def fwd_bwd(recipe):
    def f(x, w, g, key):
      y, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=key, recipe=recipe), x, w)
      return y, vjp(g)
    return jax.jit(f)

  configs = {r: (fwd_bwd(r), (x, w, g, key)) for r in recipes}
  common.log(f"bench matmul: x[{t},{k}] @ w[{k},{n}], {len(recipes)} recipes, {args.repeats} rounds")
  timings = common.time_interleaved(configs, repeats=args.repeats, log=common.log)
  base = {name: timings[name] for name in ("bf16", "int8_sr") if name in timings}
  results = {r: {**timings[r].as_dict(),
                 **{f"speedup_vs_{b}": common.paired_ratio(base[b], timings[r]) for b in base}} for r in recipes}
  rows = [[f"`{r}`", common.fmt_ms(timings[r].median), common.fmt_ms(timings[r].iqr),
           *[common.fmt_ratio(results[r].get(f"speedup_vs_{b}")) for b in ("bf16", "int8_sr")]] for r in recipes]
  body = (f"## x[{t},{k}] @ w[{k},{n}], forward + backward\n\n" +
          common.markdown_table(["recipe", "median ms", "IQR ms", "speedup vs bf16", "speedup vs int8_sr"], rows) +
          "\nSpeedups are medians of per-round paired ratios (same round, interleaved).\n")
  paths = run_.write(results, body)
  common.log(f"wrote {paths['md']}")
  print(body)
  return results
