"""`python -m research sweep`: a resumable grid of `s3r train` runs (recipes x learning rates x seeds) and
the paper's Table I / Figure 3 built from it.

Protocol (as in the paper): every recipe runs seed 0 at each learning rate of the grid; a
recipe whose best rate is the lowest of its grid gets lower rates (halving) until it is not,
and likewise higher rates (doubling) when its best is the highest, so the best is interior;
the best rate on seed 0 is then run with the other seeds. Choosing the rate on seed 0 and
keeping seed 0 in the mean biases the mean slightly in the recipe's favour, for every recipe
alike. A sweep with `fixed_lrs` (a larger scale reusing a smaller sweep's choice) runs no grid
for those recipes: every seed, 0 included, runs at the given rate. Its seed 0 is then only
mildly favoured: it shares initialization and data order with the seed 0 that chose the rate.

State lives in files, so the sweep can be stopped at any time and started again (also in a
later session): each finished run leaves a small summary, `<results>/runs/<run>.json`
(committed), and its run directory `<runs>/<run>/` (checkpoints; not committed) lets an
interrupted run resume. `<name>.json`, `<name>.md`, `<name>.png` (curves) and `<name>_gap.png`
(gap to bf16 during training, seed by seed) are rewritten after every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from labtools.results import loadavg, log, run_metadata
from research import table1
from research.protocol import SweepConfig, best_lr, next_runs, parse_fixed_lrs
from research.runs import lists_as_tuples, load_summaries, pid_alive, summarize_run

INTERRUPTED = (130, -signal.SIGINT, -signal.SIGTERM)  # `s3r train`'s exit code after Ctrl-C, or killed by one


class RunInterrupted(RuntimeError):
  """A run's `s3r train` was interrupted; the sweep resumes it when started again."""


def _train_command(cfg: SweepConfig, recipe: str, lr: float, seed: int, out: pathlib.Path) -> list[str]:
  cmd = [
    sys.executable,
    "-m",
    "s3r.cli",
    "train",
    "--recipe",
    recipe,
    "--preset",
    cfg.preset,
    "--steps",
    str(cfg.steps),
    "--warmup",
    str(cfg.warmup),
    "--lr",
    repr(lr),
    "--batch",
    str(cfg.batch),
    "--seq",
    str(cfg.seq),
    "--seed",
    str(seed),
    "--eval-every",
    str(cfg.eval_every),
    "--eval-batches",
    str(cfg.eval_batches),
    "--ckpt-every",
    str(cfg.eval_every),
    "--out",
    str(out),
    "--no-progress",
  ]
  if cfg.data:
    cmd += ["--data", cfg.data]
  if cfg.keep_every:
    cmd += ["--keep-every", str(cfg.keep_every)]
  if (out / "checkpoints").is_dir():
    cmd.append("--resume")
  return cmd


def run_one(cfg: SweepConfig, recipe: str, lr: float, seed: int, log=print) -> dict:
  """Runs (or resumes) one training run in a subprocess and writes its summary."""
  name = cfg.run_name(recipe, lr, seed)
  out = pathlib.Path(cfg.runs_dir) / cfg.name / name
  out.mkdir(parents=True, exist_ok=True)
  cmd = _train_command(cfg, recipe, lr, seed, out)
  t0, load_before = time.time(), loadavg()
  with open(out / "sweep.log", "a") as logfile:
    logfile.write(f"$ {' '.join(cmd)}\n")
    logfile.flush()
    rc = subprocess.run(cmd, stdout=logfile, stderr=subprocess.STDOUT).returncode
  if rc in INTERRUPTED:
    raise RunInterrupted(
      f"run {name} was interrupted (exit code {rc}: Ctrl-C or SIGTERM); it is resumable: its checkpoints are in "
      f"{out}, and running the same sweep command again resumes it (s3r train --resume)"
    )
  if rc not in (0, 1):  # 1 = diverged (a result); anything else is a failure to report
    raise RuntimeError(f"run {name} failed with exit code {rc}; see {out / 'sweep.log'}")
  summary = summarize_run(
    out, recipe=recipe, lr=lr, seed=seed, status="done" if rc == 0 else "diverged", wall_s=time.time() - t0
  )
  if cfg.dose_keys and rc == 0:
    summary["dose"] = measure_dose(cfg, out, log=log)
  # the code and machine the run trained with (the sweep runs its own checkout)
  summary["meta"] = {**run_metadata(), "loadavg_before": load_before, "loadavg_after": loadavg()}
  summary["git"] = summary["meta"]["git"]
  cfg.summary_dir.mkdir(parents=True, exist_ok=True)
  (cfg.summary_dir / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
  return summary


def measure_dose(cfg: SweepConfig, out: pathlib.Path, log=print) -> dict:
  """Every recipe's relative gradient errors (`gradients.relative_errors`) on the run's final
  parameters and first validation batch: the same parameters for all recipes, so the
  difference of two recipes' squared errors is the excess variance one adds over the other."""
  from research import gradients
  from research.runs import load_run

  run = load_run(str(out), log=lambda _msg: None)
  log(f"  dose at step {run['step']} ({cfg.dose_keys} keys):")
  errors = gradients.relative_errors(
    run["model_cfg"], run["params"], run["val_batch"], cfg.recipes, n_keys=cfg.dose_keys, log=log
  )
  return {"step": run["step"], "n_keys": cfg.dose_keys, "reference": gradients.REFERENCE, "errors": errors}


def sweep(cfg: SweepConfig, *, max_runs: int | None = None, only: frozenset[str] | None = None, log=log) -> dict:
  """Runs what is missing (up to `max_runs`; with `only`, just the runs of those names), rewriting the
  tables after each run."""
  done = 0
  while max_runs is None or done < max_runs:
    summaries = load_summaries(cfg)
    todo = [t for t in next_runs(cfg, summaries) if only is None or cfg.run_name(*t) in only]
    if not todo:
      if only is not None and (waiting := sorted(only - set(summaries))):
        log(f"sweep {cfg.name}: not runnable now (unknown, or waiting for seed-0 rates): {', '.join(waiting)}")
      break
    recipe, lr, seed = todo[0]
    log(
      f"sweep {cfg.name}: {len(summaries)} runs finished, next {cfg.run_name(recipe, lr, seed)} "
      f"({len(todo)} runnable now)"
    )
    s = run_one(cfg, recipe, lr, seed, log=log)
    log(f"  {s['run']}: {s['status']}, val {s['val_losses'].get('val', float('nan')):.4f} in {s['wall_s']:.0f}s")
    table1.write_tables(cfg, load_summaries(cfg))
    done += 1
  summaries = load_summaries(cfg)
  remaining = len(next_runs(cfg, summaries))
  log(f"sweep {cfg.name}: {len(summaries)} runs finished, {remaining} runnable now")
  return table1.write_tables(cfg, summaries)


def plan(cfg: SweepConfig, summaries: dict) -> str:
  """What is finished and what can run now, in order, with an estimate from the finished runs.

  Only the runs that can start now are listed: a recipe whose best seed-0 rate is at the edge
  of its grid gets more rates, and its seeds 1+ are known, only once its seed-0 runs finish.
  """
  todo = next_runs(cfg, summaries)
  walls = sorted(s["wall_s"] for s in summaries.values() if s.get("wall_s") and s["status"] == "done")
  median_min = walls[len(walls) // 2] / 60 if walls else None
  lines = [f"sweep {cfg.name}: {len(summaries)} runs finished, {len(todo)} runnable now"]
  if median_min is not None and todo:
    lines[0] += f" (~{len(todo) * median_min:.0f} min at the median {median_min:.1f} min per finished run)"
  lines += [f"  next: {cfg.run_name(*t)}" for t in todo]
  waiting = [r for r in cfg.recipes if best_lr(cfg, r, summaries)[0] is None]
  if waiting:
    lines.append(
      f"  then: for {', '.join(waiting)}, more seed-0 rates if the best is at an edge of the grid, "
      "then the other seeds at the best rate"
    )
  return "\n".join(lines)


def register(subparsers) -> None:
  d = SweepConfig()
  p = subparsers.add_parser(
    "sweep",
    help="resumable grid of training runs and the Table I report",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  p.add_argument("--config", default=None, help="JSON file with SweepConfig fields (flags override it)")
  p.add_argument("--name", default=None, help=f"sweep name (default {d.name})")
  p.add_argument("--recipes", default=None, help=f"comma-separated (default {','.join(d.recipes)})")
  p.add_argument("--lrs", default=None, help=f"comma-separated seed-0 learning rates (default {d.lrs})")
  p.add_argument(
    "--fixed-lrs",
    default=None,
    help="recipe=rate pairs, comma-separated (e.g. bf16=0.004,s3r=0.004): no grid for those recipes",
  )
  for field in ("seeds", "steps", "warmup", "batch", "seq", "eval_every", "eval_batches", "dose_keys"):
    p.add_argument(f"--{field.replace('_', '-')}", type=int, default=None, help=f"default {getattr(d, field)}")
  for field in ("preset", "data", "runs_dir", "results_dir"):
    p.add_argument(f"--{field.replace('_', '-')}", default=None, help=f"default {getattr(d, field)}")
  p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (default: all)")
  p.add_argument(
    "--only",
    default=None,
    help="comma-separated run names (as --plan prints them): run just these, e.g. a second worker in another "
    "checkout; copy its finished summaries into this checkout's runs folder and the sweep skips them",
  )
  p.add_argument("--report-only", action="store_true", help="only rewrite the tables from finished runs")
  p.add_argument(
    "--plan",
    action="store_true",
    help="print what is finished and what would run next (with a time estimate), run nothing",
  )
  p.set_defaults(func=run)


def config_from_args(args) -> SweepConfig:
  values = json.loads(pathlib.Path(args.config).read_text()) if args.config else {}
  file_fixed = values.get("fixed_lrs") or {}
  for field in dataclasses.fields(SweepConfig):
    v = getattr(args, field.name, None)
    if v is not None:
      values[field.name] = v
  if isinstance(values.get("recipes"), str):
    values["recipes"] = tuple(r.strip() for r in values["recipes"].split(",") if r.strip())
  if isinstance(values.get("lrs"), str):
    values["lrs"] = tuple(float(x) for x in values["lrs"].split(","))
  if isinstance(values.get("fixed_lrs"), str):
    values["fixed_lrs"] = parse_fixed_lrs(values["fixed_lrs"])
  if getattr(args, "fixed_lrs", None) and file_fixed:  # the flag adds to (or overrides) the file's rates
    file_fixed = parse_fixed_lrs(file_fixed) if isinstance(file_fixed, str) else file_fixed
    values["fixed_lrs"] = {**file_fixed, **values["fixed_lrs"]}
  if getattr(args, "recipes", None) and values.get("fixed_lrs"):  # --recipes picks a subset of the sweep
    values["fixed_lrs"] = {r: v for r, v in values["fixed_lrs"].items() if r in values["recipes"]}
  return SweepConfig(**lists_as_tuples(values))


def run(args) -> int:
  try:
    cfg = config_from_args(args)
  except (ValueError, TypeError, OSError) as e:
    print(f"s3r: error: {e}", file=sys.stderr)
    return 2
  lock = pathlib.Path(cfg.runs_dir) / cfg.name / "sweep.lock"
  if args.plan:
    print(plan(cfg, load_summaries(cfg)))
    return 0
  if args.report_only:
    table1.write_tables(cfg, load_summaries(cfg))
    return 0
  lock.parent.mkdir(parents=True, exist_ok=True)
  if lock.exists() and pid_alive(int(lock.read_text() or 0)):
    print(f"s3r: error: sweep {cfg.name} is already running (pid {lock.read_text()}, {lock})", file=sys.stderr)
    return 2
  lock.write_text(str(os.getpid()))
  try:
    only = frozenset(n.strip() for n in args.only.split(",") if n.strip()) if getattr(args, "only", None) else None
    sweep(cfg, max_runs=args.max_runs, only=only)
  except RunInterrupted as e:
    print(f"s3r: error: {e}", file=sys.stderr)
    return 130
  except RuntimeError as e:
    print(f"s3r: error: {e}", file=sys.stderr)
    return 1
  finally:
    lock.unlink(missing_ok=True)
  return 0
