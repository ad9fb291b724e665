"""`s3r bench step`: full training-step time of a model preset per recipe (the paper's Table IV, small).

Builds the model of `--preset` (default `cpu-small`) with each recipe, the AdamW optimizer
and the pure train step of `s3r.train.step` (jitted, state donated), feeds a fixed random
batch of token ids [B, S + 1], and times steps with the recipes interleaved (each recipe
keeps its own state, so every timed call is a real update). Reports the median step time,
tokens/s and speedups vs bf16 and int8_sr. Only the seven block projections are quantized
(ALGORITHM.md §2); embedding, logits, attention and norms run in bf16 for every recipe, so
on a small model the INT8 share of the step, and hence the possible speedup, is small.
"""

from __future__ import annotations

import argparse
import functools

from s3r.bench import options, timing
from s3r.results import RESULTS_DIR, Run, bar_chart, fmt_ms, fmt_ratio, loadavg, log, markdown_table, parse_list

DEFAULT_RECIPES = ",".join(options.BENCH_RECIPES)


def make_stepper(preset: str, recipe: str, batch: int, seq: int, vocab: int | None, seed: int = 0):
  """A zero-argument callable that runs one training step (and keeps the state), plus info."""
  import jax
  import jax.numpy as jnp

  from s3r import model as s3r_model
  from s3r.train import optimizer as opt
  from s3r.train import step as train_step_mod

  base = s3r_model.PRESETS[preset]
  overrides = {"recipe": recipe, "max_seq_len": max(base.max_seq_len, seq)}
  if vocab:
    overrides["vocab_size"] = vocab
  cfg = s3r_model.preset(preset, **overrides)
  ocfg = opt.OptimizerConfig(lr=1e-4, total_steps=10_000, warmup_steps=10)
  tx = opt.make_optimizer(ocfg)
  graphdef = s3r_model.graphdef(cfg)
  state = jax.jit(lambda k: train_step_mod.init_state(s3r_model.init_params(cfg, k), tx))(jax.random.key(seed))
  step_fn = jax.jit(train_step_mod.make_train_step(graphdef, tx, opt.schedule(ocfg)), donate_argnums=0)
  tokens = jax.random.randint(jax.random.key(seed + 1), (batch, seq + 1), 0, cfg.vocab_size, jnp.int32)
  train_key = jax.random.key(seed + 2)
  holder = {"state": state}

  def one_step():
    holder["state"], metrics = step_fn(holder["state"], tokens, train_key)
    return metrics

  info = {
    "params": s3r_model.param_count(cfg),
    "vocab_size": cfg.vocab_size,
    "d_model": cfg.d_model,
    "n_layers": cfg.n_layers,
    "d_ff": cfg.d_ff,
  }
  return one_step, info


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--preset", default="cpu-small", help="model preset (s3r.model.PRESETS; default %(default)s)")
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (default %(default)s)")
  p.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
  p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default %(default)s)")
  p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
  p.add_argument("--repeats", type=int, default=10, help="timed steps per recipe, interleaved (default %(default)s)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after the compiling step (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of parameters, batch and keys (default %(default)s)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_step_<platform>.{json,md,png} go (default %(default)s)"
  )
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES

  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  run_ = Run(
    "step",
    args.out_dir,
    preset=args.preset,
    recipes=",".join(recipes),
    batch=args.batch,
    seq=args.seq,
    vocab=args.vocab,
    repeats=args.repeats,
    warmup=args.warmup,
    seed=args.seed,
  )
  configs, info = {}, None
  for r in recipes:
    fn, info = make_stepper(args.preset, r, args.batch, args.seq, args.vocab, args.seed)
    configs[r] = (fn, ())
  log(f"[step] {args.preset} {info}, B={args.batch}, S={args.seq}, load {loadavg()}")
  timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=args.warmup, log=log)
  log("  " + ", ".join(f"{r} {t.median * 1e3:.1f} ms" for r, t in timings.items()))
  tokens = args.batch * args.seq
  rows = {}
  for r, t in timings.items():
    row = {"timing": t.as_dict(), "tokens_per_s": tokens / t.median}
    for ref in ("bf16", "int8_sr"):
      if ref in timings:
        row[f"speedup_vs_{ref}"] = timings[ref].median / t.median
        row[f"speedup_vs_{ref}_paired"] = timing.paired_ratio(timings[ref], t)
    rows[r] = row
  results = {"preset": args.preset, "model": info, "batch": args.batch, "seq": args.seq, "recipes": rows}
  paths = run_.write(results, markdown(results), chart=None if args.no_chart else functools.partial(chart, results))
  log(f"[step] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def markdown(res: dict) -> str:
  m = res["model"]
  out = [
    f"## Training step, preset `{res['preset']}` ({m['params']:,} parameters, {m['n_layers']} layers, "
    f"d_model {m['d_model']}, d_ff {m['d_ff']}, vocab {m['vocab_size']}), B={res['batch']}, S={res['seq']}",
    "",
  ]
  rows = []
  for r, row in res["recipes"].items():
    t = row["timing"]
    rows.append(
      [
        r,
        fmt_ms(t["median_s"]),
        fmt_ms(t["iqr_s"]),
        f"{row['tokens_per_s']:,.0f}",
        fmt_ratio(row.get("speedup_vs_bf16")),
        fmt_ratio(row.get("speedup_vs_int8_sr")),
      ]
    )
  out.append(
    markdown_table(["recipe", "median ms", "IQR ms", "tokens/s", "speedup vs bf16", "speedup vs int8_sr"], rows)
  )
  return "\n".join(out) + "\n"


def chart(res: dict, path) -> None:
  names = list(res["recipes"])
  series = {n: [res["recipes"][n].get("speedup_vs_bf16")] for n in names}
  bar_chart(
    path,
    [res["preset"]],
    series,
    ylabel="speedup vs bf16",
    hline=1.0,
    title=f"Training step ({res['preset']}, B={res['batch']}, S={res['seq']})",
  )
