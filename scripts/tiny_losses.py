"""Fingerprint of training on the tiny presets: the loss and gradient norm of three train steps of every tiny
family preset under every recipe, written exactly (float hex). A refactor that only moves code must leave the file
bitwise the same on one machine and JAX version:

    python scripts/tiny_losses.py --out runs/tiny_losses_before.json
    ... change the code ...
    python scripts/tiny_losses.py --check runs/tiny_losses_before.json

Uses the public API only (`s3r.model.preset`, `s3r.train`), so it runs unchanged across such moves."""

import argparse
import json
import sys
import time

import jax
import numpy as np

import s3r
from s3r import model as M
from s3r import train as T

PRESETS = ("tiny", "llama-tiny", "qwen3-tiny", "gemma3-tiny", "qwen3-moe-tiny", "deepseek-tiny", "moe-tiny")
STEPS = 3


def fingerprint(preset: str, recipe: str) -> list[list[str]]:
  """[loss, grad_norm] as float hex for each of STEPS train steps (fixed keys and tokens)."""
  cfg = M.preset(preset, recipe=recipe)
  tx = T.make_optimizer(T.OptimizerConfig(lr=1e-3, total_steps=10, warmup_steps=1))
  state = T.init_state(M.init_params(cfg, jax.random.key(0)), tx)
  step = jax.jit(T.make_train_step(M.graphdef(cfg), tx, None))
  tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, cfg.vocab_size)
  rows = []
  for _ in range(STEPS):
    state, metrics = step(state, tokens, jax.random.key(2), np.float32(1e-3))
    rows.append([float(np.float64(metrics[k])).hex() for k in ("loss", "grad_norm")])
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="write the fingerprint here")
  parser.add_argument("--check", help="compare against this fingerprint; exit 1 on any difference")
  parser.add_argument("--recipes", default=",".join(s3r.RECIPES), help="comma-separated recipes (default: all)")
  args = parser.parse_args(argv)
  if not (args.out or args.check):
    parser.error("give --out, --check or both")
  result, start = {}, time.time()
  for preset in PRESETS:
    for recipe in args.recipes.split(","):
      result[f"{preset}/{recipe}"] = fingerprint(preset, recipe)
      print(f"{preset}/{recipe}: {result[f'{preset}/{recipe}'][-1]}  ({time.time() - start:.0f} s)", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"jax": jax.__version__, "losses": result}, f, indent=1)
  if args.check:
    with open(args.check) as f:
      before = json.load(f)["losses"]
    diff = sorted(k for k in result if before.get(k) != result[k])  # the pairs run here (a subset is allowed)
    print(f"{len(result) - len(diff)} of {len(result)} bitwise the same", flush=True)
    for k in diff:
      print(f"DIFFERS {k}: {before.get(k)} -> {result[k]}")
    return 1 if diff else 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
