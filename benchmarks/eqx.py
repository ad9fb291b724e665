"""`python -m benchmarks eqx`: training steps of an Equinox model applied per example, per recipe.

The model (`benchmarks/eqx_transformer.py`) is written the way Equinox writes models: each layer sees
one token, `jax.vmap` maps it over a sequence inside the model and over the batch outside. Each recipe
runs its training step (loss, gradient, AdamW update) two ways, interleaved in one run:

- `quantize_fn`: the loss through `s3r.nn.quantize_fn`. The vmaps are inside the traced function, so
  each projection is one qmatmul of the whole batch `[B, S, K]`.
- `qmatmul+vmap`: every `eqx.nn.Linear` replaced by a layer that calls `s3r.qmatmul` itself, so each
  call sees one token and is mapped twice by `jax.vmap`; qmatmul's batching rule turns the mapped calls
  back into one batched call (docs/jax.md).

and the unquantized model (`eqx`, f32, no s3r) as the reference. Reported: median step time, the
ratio of the two paths in the same rounds, XLA's temporary memory of each compiled step.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from benchmarks import timing
from labtools.results import RESULTS_DIR, Run, fmt_ms, fmt_ratio, log, markdown_table, parse_list

DEFAULT_RECIPES = "bf16,int8_rtne,s3r,s3r_ec_dx"
PATHS = ("quantize_fn", "qmatmul+vmap")
REFERENCE = "eqx"


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (default %(default)s)")
  p.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
  p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default %(default)s)")
  p.add_argument("--dim", type=int, default=256, help="model width (default %(default)s)")
  p.add_argument("--heads", type=int, default=4, help="attention heads (default %(default)s)")
  p.add_argument("--layers", type=int, default=2, help="blocks (default %(default)s)")
  p.add_argument("--vocab", type=int, default=1024, help="vocabulary size (default %(default)s)")
  p.add_argument("--repeats", type=int, default=10, help="timed rounds, interleaved (default %(default)s)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first call (default %(default)s)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_eqx_<platform>.{json,md} go (default %(default)s)"
  )


def _steps(args, recipes):
  """{config name: (jitted step, its arguments)}; each step returns (loss, new params)."""
  import equinox as eqx
  import jax
  import optax

  import s3r.nn as snn
  from benchmarks import eqx_layers, eqx_transformer

  key = jax.random.key(0)
  model = eqx_transformer.Transformer(
    args.vocab, args.dim, args.heads, 4 * args.dim, args.layers, key=jax.random.fold_in(key, 1)
  )
  params, static = eqx.partition(model, eqx.is_inexact_array)
  tokens = jax.random.randint(jax.random.fold_in(key, 2), (args.batch, args.seq + 1), 0, args.vocab)
  opt = optax.adamw(1e-3)
  opt_state = opt.init(params)
  step_key = jax.random.fold_in(key, 3)

  def make(loss_for_key):  # loss_for_key(step key) -> loss(model, tokens)
    def step(params, opt_state, tokens, k):
      loss = loss_for_key(k)
      value, grads = jax.value_and_grad(lambda p: loss(eqx.combine(p, static), tokens))(params)
      updates, opt_state = opt.update(grads, opt_state, params)
      return value, optax.apply_updates(params, updates), opt_state

    return jax.jit(step), (params, opt_state, tokens, step_key)

  configs = {REFERENCE: make(lambda k: eqx_transformer.loss)}
  for r in recipes:
    configs[f"{r} {PATHS[0]}"] = make(lambda k, r=r: snn.quantize_fn(eqx_transformer.loss, r, key=k))
    configs[f"{r} {PATHS[1]}"] = make(
      lambda k, r=r: lambda model, tokens: eqx_transformer.loss(eqx_layers.with_qmatmul(model, k, r), tokens)
    )
  return configs


def run(args: argparse.Namespace) -> dict:
  import jax

  from benchmarks.step import memory

  try:
    import equinox  # noqa: F401
  except ImportError:
    raise SystemExit("python -m benchmarks eqx: needs Equinox (pip install -e '.[equinox]')") from None
  import s3r

  recipes = parse_list(args.recipes, list(s3r.RECIPES), "recipe")
  settings = {k: getattr(args, k) for k in ("batch", "seq", "dim", "heads", "layers", "vocab", "repeats", "warmup")}
  run_ = Run("eqx", args.out_dir, recipes=recipes, **settings)
  steps = _steps(args, recipes)
  configs: dict[str, tuple[Callable[..., Any], tuple]] = {}  # the compiled steps
  log(f"bench eqx: {len(steps)} steps, batch {args.batch} x {args.seq}, width {args.dim}, {args.layers} layers")
  info: dict[str, dict[str, Any]] = {}
  for name, (fn, fargs) in steps.items():
    t0 = time.perf_counter()
    compiled = fn.lower(*fargs).compile()
    info[name] = {"compile_s": time.perf_counter() - t0, "memory": memory(compiled)}
    info[name]["loss"] = float(compiled(*fargs)[0])  # the first step's loss: equal across paths of a recipe
    configs[name] = (compiled, fargs)
    log(
      f"  compiled {name}: {info[name]['compile_s']:.1f} s, temp {info[name]['memory'].get('temp', 0) / 2**20:.1f} MiB"
    )
  timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=args.warmup, log=log)
  results: dict[str, dict[str, Any]] = {}
  for name, t in timings.items():
    results[name] = {**t.as_dict(), **info[name], "vs_eqx": timing.paired_ratio(t, timings[REFERENCE])}
  rows = []
  for r in recipes:
    a, b = (f"{r} {p}" for p in PATHS)
    ratio = timing.paired_ratio(timings[b], timings[a])
    results[b]["vs_quantize_fn"] = ratio
    rows.append(
      [
        f"`{r}`",
        fmt_ms(timings[a].median),
        fmt_ms(timings[b].median),
        fmt_ratio(ratio),
        fmt_ratio(results[a]["vs_eqx"]),
        fmt_ratio(results[b]["vs_eqx"]),
        _mib(info[a]),
        _mib(info[b]),
      ]
    )
  ref = timings[REFERENCE]
  body = (
    f"## Equinox model applied per example: batch {args.batch} x {args.seq}, width {args.dim}, "
    f"{args.layers} layers, {args.heads} heads, vocabulary {args.vocab}\n\n"
    + markdown_table(
      [
        "recipe",
        "quantize_fn ms",
        "qmatmul+vmap ms",
        "qmatmul+vmap / quantize_fn",
        "quantize_fn / eqx",
        "qmatmul+vmap / eqx",
        "temp MiB quantize_fn",
        "temp MiB qmatmul+vmap",
      ],
      rows,
    )
    + f"\nThe unquantized model (`eqx`, f32): {fmt_ms(ref.median)} ms per step, temp {_mib(info[REFERENCE])} MiB. "
    "Ratios are of step times (below 1: faster), medians of same-round ratios (interleaved rounds). "
    "A training step is the loss, its "
    "gradient and an AdamW update. `quantize_fn` sees the batch inside the traced function; "
    "`qmatmul+vmap` calls `s3r.qmatmul` per token under two `jax.vmap`s and relies on its batching rule.\n"
  )
  paths = run_.write(results, body)
  log(f"wrote {paths['md']}")
  print(body)
  jax.clear_caches()
  return results


def _mib(info: dict) -> str:
  temp = info.get("memory", {}).get("temp")
  return "n/a" if temp is None else f"{temp / 2**20:.1f}"
