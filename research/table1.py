"""Table I and Figure 3 from a sweep's run summaries: final validation loss per recipe
(mean ± sample std over seeds at the recipe's best seed-0 learning rate, or at its fixed rate
for a sweep with `fixed_lrs`), the gap to bf16, and Welch's t against int8_sr and against bf16.

Runs with the same seed share the parameter initialization and the data order (`s3r train`
derives both from the seed; only the quantizer's randomness depends on the recipe), so the
difference of two recipes can also be taken seed by seed: the paired t-test on those
differences removes the seed-to-seed variance the recipes share. Both tests are reported."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import numpy as np

from labtools.paper import PAPER_GAP, paper_diff
from labtools.results import markdown_table, metadata_markdown, run_metadata, write_json
from research import dose_paired, stats
from research.protocol import best_lr


def build_table(cfg, summaries: dict) -> dict:
  """Rows per recipe with the best rate, the seeds' losses and the statistics."""
  rows = {}
  for recipe in cfg.recipes:
    best, _ = best_lr(cfg, recipe, summaries)
    seed0 = {
      s["lr"]: s["val_losses"].get("val") for s in summaries.values() if s["recipe"] == recipe and s["seed"] == 0
    }
    runs = (
      []
      if best is None
      else [summaries[n] for n in (cfg.run_name(recipe, best, s) for s in range(cfg.seeds)) if n in summaries]
    )
    done = [s for s in runs if s["status"] == "done"]
    row: dict[str, Any] = {
      "best_lr": best,
      "seed0_by_lr": dict(sorted(seed0.items())),
      "seeds_done": len(done),
      "diverged": len(runs) - len(done),
    }
    row["val_by_seed"] = {s["seed"]: s["val_losses"]["val"] for s in done if "val" in s["val_losses"]}
    for split in ("val", "c4"):
      values = [s["val_losses"][split] for s in done if split in s["val_losses"]]
      row[split] = values
      row[f"{split}_mean"], row[f"{split}_std"] = stats.mean_sd(values) if values else (None, None)
    rows[recipe] = row
  ref, sr = rows.get("bf16"), rows.get("int8_sr")
  for recipe, row in rows.items():
    row["gap_to_bf16"] = (
      (row["val_mean"] - ref["val_mean"])
      if ref and ref["val_mean"] is not None and row["val_mean"] is not None
      else None
    )
    row["welch_vs_bf16"] = stats.welch(row["val"], ref["val"]) if ref and recipe != "bf16" else None
    row["welch_vs_int8_sr"] = stats.welch(row["val"], sr["val"]) if sr and recipe != "int8_sr" else None
    row["paired_vs_bf16"] = stats.paired(row["val_by_seed"], ref["val_by_seed"]) if ref and recipe != "bf16" else None
    row["paper_gap"] = PAPER_GAP.get(recipe)
  return rows


# The pairs the paper's argument rests on: (a, b, what differs). Reported as a - b with Welch's t
# and the paired t over the seeds both recipes finished.
CONTRASTS = (
  ("int8_rtne", "int8_sr", "round to nearest vs stochastic rounding"),
  ("s3r", "s3r_ec_dx", "per-token thresholds without vs with the dX correction"),
  ("s3r_ec_dx", "s3r_ec", "dX-only vs two-way correction"),
  ("s3r_bcast", "s3r", "per-example vs per-token thresholds"),
  ("s3r_bcast", "s3r_ec_dx_bcast", "per-example thresholds without vs with the dX correction"),
  ("s3r_ec_dx_bcast", "s3r_ec_bcast", "per-example thresholds: dX-only vs two-way correction"),
)


def build_contrasts(rows: dict) -> list[dict]:
  """a - b in mean validation loss, Welch's t (p), the paired t (p), and the paper's difference,
  for each pair present."""
  out = []
  for a, b, what in CONTRASTS:
    if a not in rows or b not in rows or rows[a]["val_mean"] is None or rows[b]["val_mean"] is None:
      continue
    out.append(
      {
        "a": a,
        "b": b,
        "what": what,
        "diff": rows[a]["val_mean"] - rows[b]["val_mean"],
        "welch": stats.welch(rows[a]["val"], rows[b]["val"]),
        "paired": stats.paired(rows[a]["val_by_seed"], rows[b]["val_by_seed"]),
        "paper_diff": paper_diff(a, b),
      }
    )
  return out


def gap_reference(cfg) -> str | None:
  """The recipe the gap curves subtract: `bf16` when the sweep has it, else `int8_sr` (a dose sweep)."""
  return next((r for r in ("bf16", "int8_sr") if r in cfg.recipes), None)


def gap_curves(cfg, summaries: dict, rows: dict) -> dict:
  """Validation-loss gap to the reference recipe (`gap_reference`) at every evaluation, seed by seed
  (same seed: same initialization and data order): {recipe: {"steps": [...], "by_seed": {seed: [gap
  per step]}}} over finished runs."""

  def curves(recipe):
    lr = rows.get(recipe, {}).get("best_lr")
    runs = [summaries.get(cfg.run_name(recipe, lr, s)) for s in range(cfg.seeds)] if lr else []
    return {s["seed"]: dict(s["val_curve"]) for s in runs if s and s["status"] == "done" and s.get("val_curve")}

  reference = gap_reference(cfg)
  ref = curves(reference) if reference else {}
  out = {}
  for recipe in rows:
    mine = curves(recipe) if recipe != reference else {}
    by_seed = {seed: c for seed, c in mine.items() if seed in ref}
    if not by_seed:
      continue
    steps = sorted(set.intersection(*(set(c) & set(ref[seed]) for seed, c in by_seed.items())))
    out[recipe] = {
      "lr": rows[recipe]["best_lr"],
      "ref_lr": rows[reference]["best_lr"],
      "steps": steps,
      "by_seed": {seed: [c[st] - ref[seed][st] for st in steps] for seed, c in sorted(by_seed.items())},
    }
  return out


def _cost(summaries: dict) -> dict:
  done = [s for s in summaries.values() if s.get("wall_s")]
  params = next((s["param_count"] for s in done if s.get("param_count")), None)
  tc = next((s["train_config"] for s in done if s.get("train_config")), None) or {}
  tokens = tc.get("steps", 0) * tc.get("batch", 0) * tc.get("seq", 0)
  return {
    "runs": len(done),
    "total_wall_h": sum(s["wall_s"] for s in done) / 3600,
    "mean_wall_min": (np.mean([s["wall_s"] for s in done]) / 60) if done else None,
    "param_count": params,
    "tokens_per_run": tokens,
    "preset": tc.get("preset"),
    "steps": tc.get("steps"),
    "batch": tc.get("batch"),
    "seq": tc.get("seq"),
  }


def write_tables(cfg, summaries: dict) -> dict:
  """Writes <results>/<name>.json, .md and .png; returns the table rows."""
  rows = build_table(cfg, summaries)
  out = pathlib.Path(cfg.results_dir)
  out.mkdir(parents=True, exist_ok=True)
  stem = out / cfg.name
  meta = run_metadata()
  doc = {
    "meta": meta,
    "sweep": dataclasses.asdict(cfg),
    "cost": _cost(summaries),
    "rows": rows,
    "contrasts": build_contrasts(rows),
    "note": _rate_note(cfg),
    "gap_reference": gap_reference(cfg),
    "gap_curves": gap_curves(cfg, summaries, rows),
    "paired_dose": dose_paired.paired_dose(list(summaries.values())),
  }
  if cfg.equivalence_margin is not None:
    doc["paired_tests"] = dose_paired.paired_tests(doc["paired_dose"], margin=cfg.equivalence_margin)
  write_json(stem.with_suffix(".json"), doc)
  stem.with_suffix(".md").write_text(_markdown(cfg, rows, doc["cost"], meta, doc["contrasts"], doc["paired_dose"]))
  if any(s["status"] == "done" for s in summaries.values()):
    plot_curves(cfg, summaries, rows, stem.with_suffix(".png"))
  if doc["gap_curves"]:
    plot_gaps(cfg, doc["gap_curves"], out / f"{cfg.name}_gap.png")
  return rows


def _rate_note(cfg) -> str:
  fixed = [r for r in cfg.recipes if cfg.fixed_lr(r) is not None]
  grid = [r for r in cfg.recipes if r not in fixed]
  parts = []
  if grid:
    parts.append(
      f"{', '.join(grid)}: best learning rate chosen on seed 0, which is also part of the mean (as in the paper)"
    )
  if fixed:
    rates = ", ".join(f"{r}={cfg.fixed_lr(r):g}" for r in fixed)
    parts.append(f"learning rate fixed in the sweep config (chosen elsewhere), every seed at it: {rates}")
  return "; ".join(parts)


def _markdown(cfg, rows, cost, meta, contrasts=(), paired_dose=()) -> str:
  head = metadata_markdown(f"python -m research sweep {cfg.name}", meta, {})
  params = f"{cost['param_count']:,}" if cost["param_count"] else "?"
  has_bf16 = "bf16" in cfg.recipes
  tokens = f"{cost['tokens_per_run']:,}" if cost["tokens_per_run"] else "?"
  lines = [
    head,
    f"Scale: preset `{cost['preset']}` ({params} parameters), {cost['steps']} steps "
    f"x {cost['batch']} x {cost['seq']} tokens = {tokens} tokens per run; "
    f"{cost['runs']} runs, {cost['total_wall_h']:.2f} h of wall time in all.\n",
    "Final validation loss (enwiki shard 9; C4 out of domain), mean ± sample std over seeds. "
    f"Rates: {_rate_note(cfg)}. "
    + (
      "Welch's t (p) against `bf16` and `int8_sr`; paired: the per-seed difference to `bf16` (same "
      "initialization and data order), mean ± sd, and the paired t (p).\n"
      if has_bf16
      else "Welch's t (p) against `int8_sr` (the sweep has no `bf16`, so no columns against it).\n"
    ),
  ]
  table_rows = []
  for recipe, r in rows.items():
    table_rows.append(
      [
        f"`{recipe}`",
        stats.fmt(r["best_lr"], 4) if r["best_lr"] else "…",
        r["seeds_done"],
        f"{stats.fmt(r['val_mean'])} ± {stats.fmt(r['val_std'])}",
        f"{stats.fmt(r['c4_mean'])} ± {stats.fmt(r['c4_std'])}",
        stats.fmt(r["gap_to_bf16"]),
        stats.welch_cell(r["welch_vs_bf16"]),
        stats.welch_cell(r["welch_vs_int8_sr"]),
        stats.paired_cell(r["paired_vs_bf16"]),
        stats.fmt(r["paper_gap"]),
      ]
    )
  header = ["recipe", "lr", "seeds", "val loss", "C4 loss", "gap to bf16", "t vs bf16 (p)", "t vs int8_sr (p)"]
  header += ["paired vs bf16", "paper gap"]
  shown = [i for i, h in enumerate(header) if has_bf16 or "bf16" not in h]
  lines.append(markdown_table([header[i] for i in shown], [[row[i] for i in shown] for row in table_rows]))
  lr_rows = [
    [f"`{recipe}`", ", ".join(f"{lr:g}: {stats.fmt(v)}" for lr, v in r["seed0_by_lr"].items())]
    for recipe, r in rows.items()
  ]
  lines.append("\nSeed-0 validation loss per learning rate:\n\n" + markdown_table(["recipe", "lr: val"], lr_rows))
  if contrasts:
    c_rows = [
      [
        f"`{c['a']}` - `{c['b']}`",
        c["what"],
        f"{c['diff']:+.3f}",
        stats.welch_cell(c["welch"]),
        stats.paired_cell(c.get("paired")),
        "–" if c["paper_diff"] is None else f"{c['paper_diff']:+.3f}",
      ]
      for c in contrasts
    ]
    lines.append(
      "\nContrasts (difference in mean validation loss; Welch's t (p) between the two recipes' seeds; "
      "paired: per-seed difference, mean ± sd, and the paired t (p)):\n\n"
      + markdown_table(["a - b", "what differs", "ours", "Welch t (p)", "paired", "paper"], c_rows)
    )
  lines += dose_paired.paired_dose_markdown(list(paired_dose), margin=cfg.equivalence_margin)
  return "\n".join(lines)


def stack_by_step(curves: list) -> tuple[np.ndarray, np.ndarray]:
  """Curves of (step, value) points as one array [curve, step] over the steps every curve has.

  A run that resumed can record a step twice (its step-0 point, say); the last value of a step counts,
  so each column holds one step of every curve, whatever the curves' lengths."""
  by_step = [{int(step): float(value) for step, value in curve} for curve in curves]
  steps = sorted(set.intersection(*(set(c) for c in by_step)))
  return np.asarray(steps, float), np.asarray([[c[st] for st in steps] for c in by_step], float)


def plot_curves(cfg, summaries: dict, rows: dict, path: pathlib.Path) -> None:
  """Left: training loss (EMA) per recipe at its best rate, mean over seeds with a min-max band
  (log steps, as the paper's Figure 3). Right: validation loss at each evaluation, mean ± sample
  sd over seeds, where the recipes' differences are visible."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax, ax_val) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
  n_recipes = max(len(rows), 1)
  first_shown = cfg.steps // 2 - 20  # the validation panel shows the second half of training
  shown = []  # (low, high) of the validation points in view
  for i, (recipe, row) in enumerate(rows.items()):
    runs = [summaries.get(cfg.run_name(recipe, row["best_lr"], s)) for s in range(cfg.seeds)] if row["best_lr"] else []
    runs = [s for s in runs if s and s["status"] == "done" and s["curve"]]
    if not runs:
      continue
    curves = [s["curve"] for s in runs]
    steps, losses = stack_by_step(curves)
    losses = np.stack([_ema(row) for row in losses])
    (line,) = ax.plot(steps, losses.mean(axis=0), label=f"{recipe} (lr {row['best_lr']:g}, {len(curves)} seeds)")
    if len(curves) > 1:
      ax.fill_between(steps, losses.min(axis=0), losses.max(axis=0), color=line.get_color(), alpha=0.2)
    vals = [s["val_curve"] for s in runs if s.get("val_curve")]
    if vals:
      steps_v, v = stack_by_step(vals)
      sd = v.std(axis=0, ddof=1) if len(vals) > 1 else np.zeros(len(steps_v))
      offset = (i - (n_recipes - 1) / 2) * 2.0  # spread the markers of one evaluation step apart
      mean = v.mean(axis=0)
      ax_val.errorbar(
        steps_v + offset, mean, yerr=sd, color=line.get_color(), marker="o", ms=3, capsize=2, lw=1, label=recipe
      )
      keep = steps_v >= first_shown
      shown += [(lo, hi) for lo, hi in zip(mean[keep] - sd[keep], mean[keep] + sd[keep])]
  ax.set_xscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("training loss (EMA)")
  rate = "its fixed rate" if cfg.fixed_lrs and set(cfg.recipes) <= set(cfg.fixed_lrs) else "each recipe's best rate"
  ax.set_title(f"{cfg.name}: training loss at {rate} (band: min-max over seeds)", fontsize=9)
  if ax.lines:
    ax.legend(fontsize=7)
  lo = min((np.nanmin(line.get_ydata()) for line in ax.lines), default=None)
  if lo is not None:
    ax.set_ylim(lo - 0.1, lo + 3.0)
  ax_val.set_xlabel("step")
  ax_val.set_ylabel("validation loss (enwiki shard 9)")
  ax_val.set_title("validation loss: mean ± sd over seeds", fontsize=9)
  if shown:
    ax_val.legend(fontsize=7)
    ax_val.set_xlim(first_shown, cfg.steps + 20)
    lo, hi = min(l for l, _ in shown), max(h for _, h in shown)
    ax_val.set_ylim(lo - 0.1 * (hi - lo + 0.01), hi + 0.1 * (hi - lo + 0.01))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_gaps(cfg, gaps: dict, path: pathlib.Path) -> None:
  """Validation-loss gap to the reference recipe over training: one thin line per seed, the seed mean bold."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(10, 4.5))
  ax.axhline(0.0, color="black", lw=0.8)
  for recipe, g in gaps.items():
    per_seed = np.asarray(list(g["by_seed"].values()), float)
    (line,) = ax.plot(
      g["steps"],
      per_seed.mean(axis=0),
      marker="o",
      ms=3,
      lw=2,
      label=f"{recipe} at lr {g['lr']:g} − {gap_reference(cfg)} at {g['ref_lr']:g} ({len(per_seed)} seed"
      + ("s)" if len(per_seed) > 1 else ")"),
    )
    for curve in per_seed if len(per_seed) > 1 else ():
      ax.plot(g["steps"], curve, color=line.get_color(), lw=0.7, alpha=0.5)
  ax.set_xlabel("step")
  reference = gap_reference(cfg)
  ax.set_ylabel(f"validation loss − {reference}'s (same seed)")
  ax.set_title(f"{cfg.name}: gap to {reference} during training (thin: one seed; bold: mean over seeds)", fontsize=9)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _ema(values: np.ndarray, decay: float = 0.8) -> np.ndarray:
  out = np.empty_like(values)
  acc = values[0]
  for i, v in enumerate(values):
    acc = decay * acc + (1 - decay) * v
    out[i] = acc
  return out
