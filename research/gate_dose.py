"""`python -m research.gate_dose`: the activation-gradient (dX) error of each block projection under the
recipes themselves, at every gradient grid of the dose study, on the width-scan models.

The mechanism study (`research.mechanism`) computes exact errors, which it can only do token by token: for
`s3r` and for each token's error centred (`token_centred`, the row part of S3R-EC's dX term). The recipe
`s3r_ec_dx` subtracts the two-way projection, whose channel means couple the tokens of an example, so it is
measured here by sampling: per projection, the operands (x, w and the exact upstream gradient g of the
INT8 forward, `mechanism.projection_operands`) go through `s3r.qmatmul`'s backward with each recipe and
`keys` quantizer keys, and the error is sqrt(mean_k ||dX_k − dX||²) / ||dX|| against the exact backward
of the same INT8 forward (`int8_exact_bwd`). Each recipe's ratio to `int8_sr` at the same grid comes with a
95% interval from the spread of the per-key squared errors (delta method on the log of the ratio of means,
independent keys per recipe).

For the gate projections the exact int8 ratios of `s3r` and of `token_centred` on the same operands
(all tokens) are recorded beside them. Models: `mechanism.ScaleStudy`'s short trainings (Shakespeare,
batch 4 x 128, `int8_sr`, lr 2e-3), measured at `--step` (default 100, where the width scan found the
gate projections' centred error above independent SR at width 768). Grids: `int8` (Q = 127), `int6`
(31), `int4` (7), `nvfp4` (E2M1 with 16 x 16 block scales); the forward stays INT8.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from labtools import results as provenance
from research import mechanism
from research.dose import recipe_at
from s3r.quant import formats, qmatmul

GRIDS = ("int8", "int6", "int4", "nvfp4")
RECIPES = ("int8_sr", "s3r", "s3r_ec_dx")
BASE = "int8_sr"
REFERENCE = "int8_exact_bwd"


def _dx(x, w, g, key, recipe):
  return jax.vjp(lambda a: qmatmul(a, w, key=key, recipe=recipe), x)[1](g)[0]


@functools.partial(jax.jit, static_argnames="recipe")
def _sq_errors(x, w, g, exact, keys, recipe):
  """||dX_k − dX||² for each key k (one program per shape and recipe)."""
  return jax.vmap(lambda k: jnp.sum((_dx(x, w, g, k, recipe).astype(jnp.float32) - exact) ** 2))(keys)


def sampled_dx_errors(x_BxSxK, w_KxN, g_BxSxN, grid: str, *, keys: int, seed: int, dtype=jnp.bfloat16) -> dict:
  """Per recipe at `grid`: relative dX error, and the per-key squared errors relative to ||dX||². x and g
  are cast to `dtype` (the model's bf16; dX comes back in it, which adds a floor of about 2⁻¹⁸ · ||dX||²
  to each squared error, the same for every recipe)."""
  x, w = jnp.asarray(x_BxSxK, dtype), jnp.asarray(w_KxN, jnp.float32)
  g = jnp.asarray(g_BxSxN, dtype)
  exact = jax.jit(_dx, static_argnums=4)(x, w, g, None, REFERENCE).astype(jnp.float32)
  norm2 = float(jnp.sum(exact**2))
  out = {}
  for i, recipe in enumerate(RECIPES):
    ks = jax.random.split(jax.random.fold_in(jax.random.key(seed), i), keys)  # independent keys per recipe
    per_key = np.asarray(_sq_errors(x, w, g, exact, ks, recipe_at(recipe, grid)), np.float64) / norm2
    out[recipe] = {"rel_error": float(np.sqrt(per_key.mean())), "sq": per_key.tolist()}
  return out


def ratio_interval(a: ArrayLike, b: ArrayLike, z: float = 1.96) -> tuple[float, float, float]:
  """sqrt(mean a / mean b) (a ratio of relative errors) with a 95% interval: delta method on the log."""
  a_n, b_n = np.asarray(a), np.asarray(b)
  r = float(np.sqrt(a_n.mean() / b_n.mean()))
  se = 0.5 * float(np.sqrt(a_n.var(ddof=1) / a_n.mean() ** 2 / a_n.size + b_n.var(ddof=1) / b_n.mean() ** 2 / b_n.size))
  return r, r * float(np.exp(-z * se)), r * float(np.exp(z * se))


def concentration(x_BxSxK, w_KxN, g_BxSxN, grid: str) -> float | None:
  """Mean p(1 − p) of G'/Δ's residuals on a uniform grid (None for nvfp4): near 0 when concentrated."""
  fmt = formats.get_format(grid)
  if fmt.grid != "uniform":
    return None
  gp = mechanism.scaled_gradient(x_BxSxK, w_KxN, g_BxSxN)[-1]
  v = np.asarray(gp / (jnp.max(jnp.abs(gp)) / fmt.qmax), np.float64)
  p = v - np.floor(v)
  return float(np.mean(p * (1 - p)))


def measure(cfg, params, batch, grids, *, keys: int, seed: int, log=print) -> list[dict]:
  rows = []
  for layer, proj, x, w, g in mechanism.projection_operands(cfg, params, batch):
    row = {"layer": layer, "proj": proj, "grids": {}}
    if proj == "gate":  # exact, at int8 only (mechanism.local_errors): per-token sharing and its row part alone
      exact = mechanism.local_errors(x, w, g, tokens=x.shape[0] * x.shape[1])
      row["int8_exact"] = {"s3r": exact["dx_ratio"], "token_centred": exact["ec_ratio"], "rho": exact["rho"]}
    for grid in grids:
      errs = sampled_dx_errors(x, w, g, grid, keys=keys, seed=seed)
      ratios = {r: ratio_interval(errs[r]["sq"], errs[BASE]["sq"]) for r in RECIPES if r != BASE}
      row["grids"][grid] = {
        "rel_error": {r: e["rel_error"] for r, e in errs.items()},
        "ratio": {r: list(v) for r, v in ratios.items()},
        "mean_p1mp": concentration(x, w, g, grid),
      }
    rows.append(row)
    log(
      f"  block {layer} {proj}: " + ", ".join(f"{gr} {row['grids'][gr]['ratio']['s3r_ec_dx'][0]:.2f}" for gr in grids)
    )
  return rows


def _markdown(results: dict) -> str:
  lines = [provenance.metadata_markdown("python -m research.gate_dose", results["meta"], results["settings"]), ""]
  lines.append(
    "dX error of each block projection relative to `int8_sr` at the same grid: `s3r_ec_dx` (the recipe, its "
    "two-way projection) and `s3r` (per-token thresholds), with 95% intervals over the keys; mean p(1 − p) of "
    "the residuals (uniform grids; 1/6 for evenly spread residuals, near 0 when concentrated)."
  )
  for name, entry in results["entries"].items():
    lines += ["", f"## {name} (step {entry['step']}, train loss {entry['train_loss']:.3f})", ""]
    grids = list(entry["rows"][0]["grids"])
    head = "| projection | " + " | ".join(f"{g}: s3r_ec_dx / int8_sr | {g}: s3r / int8_sr | {g}: p(1−p)" for g in grids)
    lines += [head + " |", "|---|" + "--:|--:|--:|" * len(grids)]
    for row in entry["rows"]:
      cells = []
      for g in grids:
        gr = row["grids"][g]
        ec, s3 = gr["ratio"]["s3r_ec_dx"], gr["ratio"]["s3r"]
        p = "n/a" if gr["mean_p1mp"] is None else f"{gr['mean_p1mp']:.3f}"
        cells += [f"{ec[0]:.2f} ({ec[1]:.2f}-{ec[2]:.2f})", f"{s3[0]:.2f}", p]
      lines.append(f"| {row['layer']} {row['proj']} | " + " | ".join(cells) + " |")
    gates = [r for r in entry["rows"] if "int8_exact" in r]
    exact = "; ".join(
      f"block {r['layer']}: s3r {r['int8_exact']['s3r']:.2f}, token-centred {r['int8_exact']['token_centred']:.2f}, "
      f"ρ {r['int8_exact']['rho']:.1f}"
      for r in gates
    )
    lines += [
      "",
      f"Gate projections at int8, exact ratios to `int8_sr` (all tokens, `research.mechanism`): {exact}.",
    ]
    lines += [
      "",
      "Gate projections, median ratio of `s3r_ec_dx` / `int8_sr` by grid: "
      + ", ".join(
        f"{g} {np.median([r['grids'][g]['ratio']['s3r_ec_dx'][0] for r in entry['rows'] if r['proj'] == 'gate']):.2f}"
        for g in grids
      )
      + ".",
    ]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(prog="python -m research.gate_dose", description=__doc__.split("\n")[0])
  p.add_argument("--out", default="runs/results/gate_dose", help="output stem (.json, .md)")
  p.add_argument("--models", default="w768-d4,w192-d4", help="SCALE_MODELS entries, measured in this order")
  p.add_argument("--grids", default=",".join(GRIDS))
  p.add_argument("--step", type=int, default=100, help="training step at which the projections are measured")
  p.add_argument("--keys", type=int, default=16, help="quantizer keys per recipe and projection")
  p.add_argument("--seed", type=int, default=0, help="seed of the quantizer keys")
  p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
  args = p.parse_args(argv)
  out, path, results = mechanism.open_results(args.out)
  if args.report_only:
    out.with_suffix(".md").write_text(_markdown(results))
    return results
  grids = [g for g in args.grids.split(",") if g]
  if unknown := [g for g in grids if g not in GRIDS]:
    raise SystemExit(f"python -m research.gate_dose: unknown grid(s) {unknown}; known: {', '.join(GRIDS)}")
  by_name = {m[0]: m for m in mechanism.SCALE_MODELS}
  if unknown := [m for m in args.models.split(",") if m not in by_name]:
    raise SystemExit(f"python -m research.gate_dose: unknown model(s) {unknown}; known: {', '.join(by_name)}")
  study = mechanism.ScaleStudy(steps=args.step, measure_at=(args.step,))
  settings = {"grids": grids, "keys": args.keys, "seed": args.seed, "step": args.step, "study": study.__dict__}
  results.update(meta=provenance.run_metadata(argv), settings=settings, complete=False)
  corpus, batch = mechanism.study_data(study)
  for name in args.models.split(","):
    if name in results["entries"]:
      continue
    cfg = mechanism.scale_config(study, by_name[name], corpus.tokenizer.vocab_size)

    def visit(step, params, loss, name=name, cfg=cfg):
      print(f"{name} at step {step} (train loss {loss:.3f}): measuring", flush=True)
      rows = measure(cfg, params, batch, grids, keys=args.keys, seed=args.seed)
      results["entries"][name] = {"step": step, "train_loss": loss, "rows": rows}
      provenance.write_json(path, results)
      out.with_suffix(".md").write_text(_markdown(results))

    mechanism.train_visiting(study, cfg, corpus, [args.step], visit)
  results["complete"] = True
  results["meta"]["loadavg_after"] = provenance.loadavg()
  provenance.write_json(path, results)
  out.with_suffix(".md").write_text(_markdown(results))
  print(out.with_suffix(".md").read_text())
  return results


if __name__ == "__main__":
  main()
