"""One quantized linear layer, forward + backward: x [T, K] @ w [K, N] per recipe.

The core-level speed check (issue: the s3r_ec_dx layer must be no slower than bf16 and at
least 1.5x faster than independent SR). Each recipe returns y, dX and dW for a random bf16
upstream gradient; repeats are interleaved and ratios are taken within the run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from benchmarks import timing
from labtools.results import RESULTS_DIR, Run, fmt_ms, fmt_ratio, log, markdown_table, parse_list

RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec_dx", "s3r_ec")
FAST_BF16 = "bf16_fast_layout"  # reference row: bf16 with the same saved-transpose trick as the INT8 path


def fast_layout_bf16():
  """x @ w in bf16 (f32 accumulation) whose backward reads a materialized xᵀ, like qmatmul's.

  Plain autodiff of a bf16 matmul makes XLA:CPU contract the token dimension for dW, a slow
  layout; this is the fairest bf16 baseline we know how to build on XLA:CPU. It returns dW in
  f32 (autodiff of the `bf16` recipe rounds it to bf16 first); otherwise the same math.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax

  from s3r.quant import numerics

  def fwd(x, w):
    wb = w.astype(jnp.bfloat16)
    y = jnp.matmul(x, wb, preferred_element_type=jnp.float32).astype(x.dtype)
    return y, (numerics.materialized_transpose(x, jnp.float32(1)), wb)

  def bwd(res, g):
    xT, wb = res
    dx = lax.dot_general(g, wb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dw = lax.dot_general(xT, g, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return dx.astype(g.dtype), dw

  mm = jax.custom_vjp(lambda x, w: fwd(x, w)[0])
  mm.defvjp(fwd, bwd)
  return mm


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--shape", default="2048,1024,4096", help="T,K,N: tokens, input and output features")
  p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipes")
  p.add_argument("--repeats", type=int, default=9, help="interleaved timed rounds")
  p.add_argument("--no-fast-bf16", action="store_true", help=f"skip the {FAST_BF16} reference row")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_matmul_<platform>.{json,md,png} go (default %(default)s)"
  )


def run(args: argparse.Namespace) -> dict:
  import jax
  import jax.numpy as jnp

  import s3r

  try:
    t, k, n = (int(v) for v in args.shape.split(","))
  except ValueError:
    raise SystemExit(
      f"python -m benchmarks matmul: --shape must be T,K,N (three integers), got {args.shape!r}"
    ) from None
  recipes = parse_list(args.recipes, list(s3r.RECIPES), "recipe")
  run_ = Run("matmul", args.out_dir, shape=[t, k, n], recipes=recipes, repeats=args.repeats)
  x = jax.random.normal(jax.random.key(0), (t, k), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (k, n), jnp.float32) * 0.02
  g = jax.random.normal(jax.random.key(2), (t, n), jnp.bfloat16)
  key = jax.random.key(3)

  def fwd_bwd(layer):  # layer(x, w, key) -> y; returns jit((x, w, g, key) -> (y, (dx, dw)))
    def f(x, w, g, key):
      y, vjp = jax.vjp(lambda a, b: layer(a, b, key), x, w)
      return y, vjp(g)

    return jax.jit(f)

  layers: dict[str, Callable[..., jax.Array]] = {
    r: (lambda a, b, key, r=r: s3r.qmatmul(a, b, key=key, recipe=r)) for r in recipes
  }
  if not args.no_fast_bf16:
    mm = fast_layout_bf16()
    layers[FAST_BF16] = lambda a, b, key: mm(a, b)
  configs = {name: (fwd_bwd(layer), (x, w, g, key)) for name, layer in layers.items()}
  log(f"bench matmul: x[{t},{k}] @ w[{k},{n}], {len(recipes)} recipes, {args.repeats} rounds")
  timings = timing.time_interleaved(configs, repeats=args.repeats, log=log)
  base = {name: timings[name] for name in ("bf16", FAST_BF16, "int8_sr") if name in timings}
  names = list(configs)
  results = {
    r: {**timings[r].as_dict(), **{f"speedup_vs_{b}": timing.paired_ratio(base[b], timings[r]) for b in base}}
    for r in names
  }
  cols = [b for b in ("bf16", FAST_BF16, "int8_sr") if b in base]
  rows = [
    [
      f"`{r}`",
      fmt_ms(timings[r].median),
      fmt_ms(timings[r].iqr),
      *[fmt_ratio(results[r].get(f"speedup_vs_{b}")) for b in cols],
    ]
    for r in names
  ]
  body = (
    f"## x[{t},{k}] @ w[{k},{n}], forward + backward\n\n"
    + markdown_table(["recipe", "median ms", "IQR ms", *[f"speedup vs {b}" for b in cols]], rows)
    + f"\nSpeedups are medians of per-round paired ratios (same round, interleaved). `{FAST_BF16}` is "
    "a reference bf16 layer with the same saved-transpose layout trick as the INT8 path "
    "(`benchmarks.matmul.fast_layout_bf16`), the fairest bf16 baseline on XLA:CPU.\n"
  )
  paths = run_.write(results, body)
  log(f"wrote {paths['md']}")
  print(body)
  return results
