"""`s3r models`: every preset with its family, shape and total / active parameter counts.

Totals are summed over the parameter shapes of the model built under `jax.eval_shape` (nothing is
allocated). Active = parameters one token uses: the total less the routed experts it is not sent to.
"""

from __future__ import annotations

import json


def counts(cfg) -> dict:
  """{"params_total", "params_active", "counted_from"} of one model config."""
  import jax

  from s3r.model import active_param_count, init_params, param_count

  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  total = sum(x.size for x in jax.tree.leaves(shapes))
  inactive = param_count(cfg) - active_param_count(cfg)
  return {"params_total": int(total), "params_active": int(total - inactive), "counted_from": "shapes"}


def rows() -> list[dict]:
  from s3r.model import PRESETS

  return [
    {
      "name": name,
      "family": cfg.family,
      "layers": cfg.n_layers,
      "width": cfg.d_model,
      "vocab_size": cfg.vocab_size,
      "max_seq_len": cfg.max_seq_len,
      **counts(cfg),
    }
    for name, cfg in PRESETS.items()
  ]


def run(args) -> int:
  table = rows()
  if args.json:
    print(json.dumps(table, indent=1))
    return 0
  print(f"{'preset':<18} {'family':<12} {'layers':>6} {'width':>6} {'params':>16} {'active':>16}")
  for r in table:
    print(
      f"{r['name']:<18} {r['family']:<12} {r['layers']:>6} {r['width']:>6} {r['params_total']:>16,} "
      f"{r['params_active']:>16,}"
    )
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser(
    "models",
    help="list the model presets with their parameter counts",
    description="Every model preset with its family, depth, width and total / active "
    "(per-token) parameter counts, computed from shapes without allocating.",
  )
  p.add_argument(
    "--json", action="store_true", help="print a JSON list of objects (name, params_total, params_active, ...)"
  )
  p.set_defaults(func=run)
