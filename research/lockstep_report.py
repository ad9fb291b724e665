"""The lockstep run's summary: paired differences, curves, the dose, and its Markdown report.

`write_summary` is called after every evaluation (and once at the end), so `summary.json` and
`summary.md` always describe the run so far.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from labtools import results as provenance
from research.gradients import METRIC_LABELS, METRICS

PAIRS = (("s3r", "int8_sr"), ("s3r", "s3r_ec_dx"), ("s3r_ec_dx", "int8_sr"))
# Table I of the paper (final validation loss, mean of three seeds, each recipe at its own best rate).
PAPER_LOSS = {"int8_sr": 4.929, "s3r": 5.055, "s3r_ec_dx": 4.924}
PAPER_SEED_SD = 0.02  # the paper's seed standard deviations are 0.013-0.022
ONE_SEED = (
  "One seed gives one paired difference per evaluation. Its eval_se is the sampling error of the "
  "fixed validation batches only; seed-to-seed variation (sd about 0.02 per recipe in the paper, so "
  "about 0.03 for a difference of two independent runs) is not measured. One seed can therefore "
  "confirm or refute a gap of the paper's size (0.126, about four such standard deviations) but "
  "cannot resolve differences below about 0.06, cannot give a p-value, and cannot separate a "
  "recipe effect from a seed-specific trajectory."
)


def finite(x: float) -> float | None:
  """x, or None where JSON has no number (NaN, infinity)."""
  return x if math.isfinite(x) else None


def _pairs_present(recipes: tuple[str, ...]) -> list[tuple[str, str, bool]]:
  """(a, b, at INT8) for each pair of PAIRS whose two recipes ran at one gradient format: plain
  names, or both NAME@FORMAT with the same FORMAT (recipes A@F and B@F)."""
  out = []
  for fmt in dict.fromkeys(r.partition("@")[2] for r in recipes):
    suffix = f"@{fmt}" if fmt else ""
    out += [(a + suffix, b + suffix, not fmt) for a, b in PAIRS if a + suffix in recipes and b + suffix in recipes]
  return out


def paired(records: list[dict], recipes: tuple[str, ...], steps_done: int) -> dict:
  """Per pair (a, b) of PAIRS present in the run (at one gradient format): a - b at every evaluation,
  the final difference with its eval-sampling standard error (paired over the fixed batches) and the
  mean over the last quarter of the evaluated steps; the paper's difference only at INT8."""
  out = {}
  for a, b, at_int8 in _pairs_present(recipes):
    if not records:
      continue
    diffs = [r["val"][a] - r["val"][b] if None not in (r["val"][a], r["val"][b]) else None for r in records]
    last = records[-1]["val_batches"]
    d_batches = np.asarray(last[a], np.float64) - np.asarray(last[b], np.float64)
    se = float(np.std(d_batches, ddof=1) / math.sqrt(len(d_batches))) if len(d_batches) > 1 else None
    late = [d for r, d in zip(records, diffs) if d is not None and r["step"] >= 0.75 * steps_done]
    out[f"{a} - {b}"] = {
      "final": diffs[-1],
      "final_step": records[-1]["step"],
      "eval_se": finite(se) if se is not None else None,
      "last_quarter_mean": float(np.mean(late)) if late else None,
      "curve": diffs,
      "paper": round(PAPER_LOSS[a] - PAPER_LOSS[b], 3) if at_int8 else None,
    }
  return out


def is_complete(ended: bool, steps_done: int, schedule_steps: int) -> bool:
  """A run is complete when it ended with its schedule run to the end: a run stopped by the time
  budget, or one that trained nothing, is not."""
  return ended and 0 < steps_done == schedule_steps


def write_summary(
  out, summary, records, recipes, step, iter_times, *, ended, stopped_by, dose=None, dose_same_params=None
) -> dict:
  """Writes summary.json and summary.md in `out` (`ended`: the run's last write, not a progress
  write); returns the summary."""
  summary = {
    **summary,
    "one_seed": ONE_SEED,
    "ended": ended,
    "complete": is_complete(ended, step, summary["schedule"]["steps"]),
    "stopped_by": stopped_by,
    "steps_done": step,
    "iteration_s_median": float(np.median(iter_times)) if iter_times else None,
    "iteration_s_first": iter_times[0] if iter_times else None,
    "curves": {
      "step": [r["step"] for r in records],
      **{
        k: {rc: [r[k][rc] for r in records] for rc in recipes}
        for k in (records[0] if records else {})
        if k.startswith("val") and k != "val_batches"
      },
    },
    "paired": paired(records, recipes, step),
    "dose": dose,
    "dose_same_params": dose_same_params,
  }
  provenance.write_json(pathlib.Path(out) / "summary.json", summary)
  (pathlib.Path(out) / "summary.md").write_text(markdown(summary))
  return summary


def _fmt(x: float | None, spec: str = "+.4f") -> str:
  return "–" if x is None else format(x, spec)


def markdown(summary: dict) -> str:
  """The report: settings, final losses, paired differences against the paper, and the dose."""
  cfg, sched = summary["config"], summary["schedule"]
  if summary["complete"]:
    state = "complete"
  elif summary.get("ended"):
    state = f"INCOMPLETE (the schedule did not run to its end; stopped by {summary['stopped_by']})"
  else:
    state = "running (or stopped from outside)"
  lines = [
    f"# Lockstep run: {cfg['preset']}, {', '.join(cfg['recipes'])}",
    "",
    provenance.metadata_lines(summary["meta"], {}),
    "",
    f"- {summary['param_count']:,} parameters; batch {cfg['batch']} x seq {cfg['seq']}; peak lr {cfg['lr']}; "
    f"seed {cfg['seed']}; attention {summary['attention']['impl']}"
    + (f" ({summary['attention']['note']})" if summary["attention"]["note"] else ""),
    f"- schedule: {sched['steps']} steps, warm-up {sched['warmup']}"
    + (" (fitted to the time budget after compilation)" if sched["fitted"] else "")
    + f"; {state}: {summary['steps_done']} steps done, stopped by {summary['stopped_by']}",
    f"- compile {summary['compile_s']:.1f} s{_compile_detail(summary)}; "
    f"iteration {_fmt(summary['iteration_s_median'], '.3f')} s (median)",
    "",
  ]
  curves = summary["curves"]
  if curves["step"]:
    lines += ["## Final validation loss", "", "| recipe | " + " | ".join(k for k in curves if k != "step") + " |"]
    lines += ["| --- |" + " --- |" * (len(curves) - 1)]
    for r in cfg["recipes"]:
      lines.append(f"| `{r}` | " + " | ".join(_fmt(curves[k][r][-1], ".4f") for k in curves if k != "step") + " |")
    lines.append("")
  if summary["paired"]:
    lines += ["## Paired differences (validation)", "", "| pair | final | eval se | last quarter | paper |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for name, d in summary["paired"].items():
      se = _fmt(d["eval_se"], ".4f")
      paper = _fmt(d["paper"], "+.3f")
      lines.append(f"| {name} | {_fmt(d['final'])} | {se} | {_fmt(d['last_quarter_mean'])} | {paper} |")
    lines += ["", summary["one_seed"], ""]
  if summary["dose"]:
    lines += ["## Dose: relative gradient errors on the final parameters", ""]
    lines += _error_table(summary["dose"])
  same = summary.get("dose_same_params")
  if same:
    lines += [f"## Dose: every recipe's relative gradient errors on the final parameters of `{same['params_of']}`", ""]
    lines += _error_table(same["errors"])
  return "\n".join(lines)


def _compile_detail(summary: dict) -> str:
  """The report's compile detail: each recipe's train-step compile (its own thread), the evaluation
  programs' where known, and the XLA_FLAGS; "" for summaries written before these were recorded."""
  per, loaded = summary.get("compile_s_by_recipe") or {}, summary.get("loaded_s_by_recipe") or {}
  if not per and not loaded:
    return ""
  evals = summary.get("eval_compile_s_by_recipe") or {}
  parts = [f"`{r}` {s:.1f} s" + (f" (eval {evals[r]:.1f} s)" if r in evals else "") for r, s in per.items()]
  parts += [f"`{r}` compiled ahead of time, loaded in {s:.1f} s" for r, s in loaded.items()]
  flags = summary.get("xla_flags") or "none"
  return f" (train step per recipe, each on its own thread: {', '.join(parts)}; XLA_FLAGS: {flags})"


def _error_table(errors: dict) -> list[str]:
  lines = ["| recipe | " + " | ".join(METRIC_LABELS[m] for m in METRICS) + " |", "| --- |" + " --- |" * len(METRICS)]
  lines += [f"| `{r}` | " + " | ".join(f"{errs[m]:.4f}" for m in METRICS) + " |" for r, errs in errors.items()]
  return lines + [""]
