"""`s3r sweep`: a resumable grid of `s3r train` runs (recipes x learning rates x seeds) and
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
import math
import os
import pathlib
import subprocess
import sys
import time

from s3r.experiments import table1
from s3r.results import git_info, log

DEFAULT_RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec_dx", "s3r_ec", "s3r_bcast", "s3r_ec_dx_bcast",
                   "s3r_ec_bcast")
MAX_EXTENSIONS = 5  # at most this many halvings or doublings beyond a recipe's grid


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
  """The grid and the settings shared by all its runs."""

  name: str = "table1"  # sweep name: results go to <results>/<name>/, runs to <runs>/<name>/
  recipes: tuple[str, ...] = DEFAULT_RECIPES  # recipes to compare
  lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3)  # learning-rate grid for seed 0
  # recipe -> rate chosen elsewhere (e.g. by a smaller-scale sweep): no grid, every seed at it;
  # a dict, so a config with fixed rates is not hashable
  fixed_lrs: dict[str, float] | None = None
  seeds: int = 3  # seeds 0..seeds-1 at each recipe's best rate
  preset: str = "cpu-small"  # model preset
  steps: int = 400  # steps per run
  warmup: int = 40  # warm-up steps per run
  batch: int = 8  # sequences per step
  seq: int = 256  # tokens per sequence
  data: str | None = None  # corpus (None: enwiki shards 0-8, validation shard 9 and C4)
  eval_every: int = 100  # validation every N steps
  eval_batches: int = 16  # batches per validation set
  runs_dir: str = "runs/sweeps"  # run directories (checkpoints)
  results_dir: str = "results"  # summaries and tables

  def __post_init__(self):
    from s3r.quant import RECIPES
    bad = [r for r in self.recipes if r not in RECIPES]
    if bad:
      raise ValueError(f"SweepConfig.recipes: unknown {bad}; valid: {', '.join(RECIPES)}")
    if not self.lrs or any(not lr > 0 for lr in self.lrs):
      raise ValueError(f"SweepConfig.lrs must be positive learning rates, got {self.lrs}")
    fixed = self.fixed_lrs or {}
    if not isinstance(fixed, dict) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                          or not 0 < v < math.inf for v in fixed.values()):
      raise ValueError(f"SweepConfig.fixed_lrs must map recipe names to positive finite rates, got {self.fixed_lrs!r}")
    unused = [r for r in fixed if r not in self.recipes]
    if unused:
      raise ValueError(f"SweepConfig.fixed_lrs: {unused} not in SweepConfig.recipes {list(self.recipes)}")
    # run names keep 3 significant digits: a finer rate would share a name (and a run) with another
    inexact = {r: v for r, v in fixed.items() if float(f"{v:.3g}") != v}
    if inexact:
      raise ValueError(f"SweepConfig.fixed_lrs: rates must have at most 3 significant digits, got {inexact}")
    if self.fixed_lrs is not None:  # a private copy with float rates
      object.__setattr__(self, "fixed_lrs", {r: float(v) for r, v in fixed.items()})
    if self.seeds < 1:
      raise ValueError(f"SweepConfig.seeds must be >= 1, got {self.seeds}")

  @property
  def summary_dir(self) -> pathlib.Path:
    return pathlib.Path(self.results_dir) / self.name / "runs"

  def fixed_lr(self, recipe: str) -> float | None:
    """The recipe's rate from `fixed_lrs`, or None when the sweep chooses it on seed 0."""
    return (self.fixed_lrs or {}).get(recipe)

  def run_name(self, recipe: str, lr: float, seed: int) -> str:
    return f"{recipe}-lr{lr:.3g}-s{seed}"


def load_summaries(cfg: SweepConfig) -> dict[str, dict]:
  """Finished runs of this sweep, by run name."""
  out = {}
  if cfg.summary_dir.is_dir():
    for path in sorted(cfg.summary_dir.glob("*.json")):
      out[path.stem] = json.loads(path.read_text())
  return out


def _final_val(summary: dict | None) -> float:
  if summary is None or summary["status"] != "done":
    return math.inf
  return summary["val_losses"].get("val", math.inf)


def best_lr(cfg: SweepConfig, recipe: str, summaries: dict) -> tuple[float | None, list[float]]:
  """(best rate so far or None if some seed-0 run is missing, the rates to run next); a recipe
  in `fixed_lrs` always gets its fixed rate and no grid."""
  if cfg.fixed_lr(recipe) is not None:
    return cfg.fixed_lr(recipe), []  # chosen elsewhere: seeds 0.. all run at it
  lrs = sorted(set(cfg.lrs))
  for _ in range(MAX_EXTENSIONS + 1):
    missing = [lr for lr in lrs if cfg.run_name(recipe, lr, 0) not in summaries]
    if missing:
      return None, missing
    losses = {lr: _final_val(summaries[cfg.run_name(recipe, lr, 0)]) for lr in lrs}
    best = min(lrs, key=lambda lr: losses[lr])
    if len(lrs) == 1 or best not in (lrs[0], lrs[-1]) or not math.isfinite(losses[best]):
      return best, []  # an interior best (or a single rate: nothing to select)
    # the best is at an edge of the rates tried: extend the grid past it
    lrs = [lrs[0] / 2] + lrs if best == lrs[0] else lrs + [lrs[-1] * 2]
  return best, []


def next_runs(cfg: SweepConfig, summaries: dict) -> list[tuple[str, float, int]]:
  """The runs that can start now: grid recipes recipe by recipe, then fixed-rate ones seed by seed.

  A grid recipe's seeds 1+ come right after its seed-0 grid settles, so a sweep stopped
  part-way leaves whole 3-seed rows for the first recipes rather than seed-0 numbers for all
  of them. Recipes with a fixed rate have nothing to select, so their runs go seed-major
  (seed 0 of each, then seed 1 of each, ...): stopped part-way, they are compared on the
  same seeds.
  """
  grid, fixed = [], []
  for recipe in cfg.recipes:
    best, pending = best_lr(cfg, recipe, summaries)
    grid += [(recipe, lr, 0) for lr in pending]
    if best is None:
      continue
    is_fixed = cfg.fixed_lr(recipe) is not None
    seeds = range(0 if is_fixed else 1, cfg.seeds)  # a grid recipe's seed 0 ran in the grid
    runs = [(recipe, best, s) for s in seeds if cfg.run_name(recipe, best, s) not in summaries]
    (fixed if is_fixed else grid).extend(runs)
  return grid + sorted(fixed, key=lambda run: run[2])  # stable: config order within a seed


def _train_command(cfg: SweepConfig, recipe: str, lr: float, seed: int, out: pathlib.Path) -> list[str]:
  cmd = [sys.executable, "-m", "s3r.cli", "train", "--recipe", recipe, "--preset", cfg.preset,
         "--steps", str(cfg.steps), "--warmup", str(cfg.warmup), "--lr", repr(lr), "--batch", str(cfg.batch),
         "--seq", str(cfg.seq), "--seed", str(seed), "--eval-every", str(cfg.eval_every),
         "--eval-batches", str(cfg.eval_batches), "--ckpt-every", str(cfg.eval_every), "--out", str(out),
         "--no-progress"]
  if cfg.data:
    cmd += ["--data", cfg.data]
  if (out / "checkpoints").is_dir():
    cmd.append("--resume")
  return cmd


def run_one(cfg: SweepConfig, recipe: str, lr: float, seed: int, log=print) -> dict:
  """Runs (or resumes) one training run in a subprocess and writes its summary."""
  name = cfg.run_name(recipe, lr, seed)
  out = pathlib.Path(cfg.runs_dir) / cfg.name / name
  out.mkdir(parents=True, exist_ok=True)
  cmd = _train_command(cfg, recipe, lr, seed, out)
  t0 = time.time()
  with open(out / "sweep.log", "a") as logfile:
    logfile.write(f"$ {' '.join(cmd)}\n")
    logfile.flush()
    rc = subprocess.run(cmd, stdout=logfile, stderr=subprocess.STDOUT).returncode
  if rc not in (0, 1):  # 1 = diverged (a result); anything else is a failure to report
    raise RuntimeError(f"run {name} failed with exit code {rc}; see {out / 'sweep.log'}")
  summary = table1.summarize_run(out, recipe=recipe, lr=lr, seed=seed, status="done" if rc == 0 else "diverged",
                                 wall_s=time.time() - t0)
  summary["git"] = git_info()  # the code the run trained with (the sweep runs its own checkout)
  cfg.summary_dir.mkdir(parents=True, exist_ok=True)
  (cfg.summary_dir / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
  return summary


def sweep(cfg: SweepConfig, *, max_runs: int | None = None, log=log) -> dict:
  """Runs what is missing (up to `max_runs`), rewriting the tables after each run."""
  done = 0
  while max_runs is None or done < max_runs:
    summaries = load_summaries(cfg)
    todo = next_runs(cfg, summaries)
    if not todo:
      break
    recipe, lr, seed = todo[0]
    log(f"sweep {cfg.name}: {len(summaries)} runs finished, next {cfg.run_name(recipe, lr, seed)} "
        f"({len(todo)} runnable now)")
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
    lines.append(f"  then: for {', '.join(waiting)}, more seed-0 rates if the best is at an edge of the grid, "
                 "then the other seeds at the best rate")
  return "\n".join(lines)


def register(subparsers) -> None:
  d = SweepConfig()
  p = subparsers.add_parser("sweep", help="resumable grid of training runs and the Table I report",
                            description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", default=None, help="JSON file with SweepConfig fields (flags override it)")
  p.add_argument("--name", default=None, help=f"sweep name (default {d.name})")
  p.add_argument("--recipes", default=None, help=f"comma-separated (default {','.join(d.recipes)})")
  p.add_argument("--lrs", default=None, help=f"comma-separated seed-0 learning rates (default {d.lrs})")
  p.add_argument("--fixed-lrs", default=None,
                 help="recipe=rate pairs, comma-separated (e.g. bf16=0.004,s3r=0.004): no grid for those recipes")
  for field in ("seeds", "steps", "warmup", "batch", "seq", "eval_every", "eval_batches"):
    p.add_argument(f"--{field.replace('_', '-')}", type=int, default=None, help=f"default {getattr(d, field)}")
  for field in ("preset", "data", "runs_dir", "results_dir"):
    p.add_argument(f"--{field.replace('_', '-')}", default=None, help=f"default {getattr(d, field)}")
  p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (default: all)")
  p.add_argument("--report-only", action="store_true", help="only rewrite the tables from finished runs")
  p.add_argument("--plan", action="store_true",
                 help="print what is finished and what would run next (with a time estimate), run nothing")
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
    values["fixed_lrs"] = _parse_fixed_lrs(values["fixed_lrs"])
  if getattr(args, "fixed_lrs", None) and file_fixed:  # the flag adds to (or overrides) the file's rates
    file_fixed = _parse_fixed_lrs(file_fixed) if isinstance(file_fixed, str) else file_fixed
    values["fixed_lrs"] = {**file_fixed, **values["fixed_lrs"]}
  if getattr(args, "recipes", None) and values.get("fixed_lrs"):  # --recipes picks a subset of the sweep
    values["fixed_lrs"] = {r: v for r, v in values["fixed_lrs"].items() if r in values["recipes"]}
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  return SweepConfig(**values)


def _parse_fixed_lrs(text: str) -> dict[str, float]:
  out = {}
  for item in filter(None, (t.strip() for t in text.split(","))):
    recipe, sep, rate = item.partition("=")
    try:
      out[recipe.strip()] = float(rate)
    except ValueError:
      sep = ""
    if not sep:
      raise ValueError(f"fixed_lrs (--fixed-lrs or the config file): expected recipe=rate pairs such as "
                       f"bf16=0.004, got {item!r}")
  return out


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
  if lock.exists() and _alive(int(lock.read_text() or 0)):
    print(f"s3r: error: sweep {cfg.name} is already running (pid {lock.read_text()}, {lock})", file=sys.stderr)
    return 2
  lock.write_text(str(os.getpid()))
  try:
    sweep(cfg, max_runs=args.max_runs)
  except RuntimeError as e:
    print(f"s3r: error: {e}", file=sys.stderr)
    return 1
  finally:
    lock.unlink(missing_ok=True)
  return 0


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except (OSError, ValueError):
    return False
  return pid > 0
