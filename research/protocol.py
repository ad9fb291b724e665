"""The sweep protocol: the grid of a sweep, and which runs come next (pure functions).

Every recipe runs seed 0 at each learning rate of the grid; a recipe whose best rate is the lowest
of its grid gets lower rates (halving) until it is not, and likewise higher rates (doubling) when
its best is the highest, so the best is interior; the best rate on seed 0 is then run with the
other seeds. A recipe in `fixed_lrs` runs no grid: every seed, 0 included, runs at the given rate.
A run summary is the dict `runs.summarize_run` writes; `summaries` maps run names to them.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

DEFAULT_RECIPES = (
  "bf16",
  "int8_rtne",
  "int8_sr",
  "s3r",
  "s3r_ec_dx",
  "s3r_ec",
  "s3r_bcast",
  "s3r_ec_dx_bcast",
  "s3r_ec_bcast",
)
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
  # > 0: at the end of each finished run, every recipe's relative gradient errors on the run's
  # final parameters over this many keys (the dose of rounding noise the run ends with)
  dose_keys: int = 0
  # > 0: each run keeps every checkpoint whose step is a multiple of this (`s3r train --keep-every`;
  # a multiple of eval_every, the checkpoint interval), for `python -m research.dose_trajectory`
  keep_every: int | None = None
  # the smallest loss difference of interest, fixed before the runs: with it, the paired reports add the
  # 95% intervals, the equivalence test within ±margin and the decision rules' verdicts
  equivalence_margin: float | None = None
  runs_dir: str = "runs/sweeps"  # run directories (checkpoints)
  results_dir: str = "runs/results"  # summaries and tables (the committed sweeps: research/results)

  def __post_init__(self):
    from s3r.quant import RECIPES

    bad = [r for r in self.recipes if r not in RECIPES]
    if bad:
      raise ValueError(f"SweepConfig.recipes: unknown {bad}; valid: {', '.join(RECIPES)}")
    if not self.lrs or any(not lr > 0 for lr in self.lrs):
      raise ValueError(f"SweepConfig.lrs must be positive learning rates, got {self.lrs}")
    fixed = self.fixed_lrs or {}
    if not isinstance(fixed, dict) or any(
      isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in fixed.values()
    ):
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
    if self.dose_keys < 0:
      raise ValueError(f"SweepConfig.dose_keys must be >= 0, got {self.dose_keys}")
    if self.keep_every is not None and (self.keep_every < 1 or self.keep_every % self.eval_every):
      raise ValueError(f"SweepConfig.keep_every must be a positive multiple of eval_every, got {self.keep_every}")
    if self.equivalence_margin is not None and not 0 < self.equivalence_margin < math.inf:
      raise ValueError(
        f"SweepConfig.equivalence_margin must be a positive loss difference, got {self.equivalence_margin}"
      )
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


def final_val(summary: dict | None) -> float:
  """A run's final validation loss; infinite for a missing or diverged run."""
  if summary is None or summary["status"] != "done":
    return math.inf
  return summary["val_losses"].get("val", math.inf)


def best_lr(cfg: SweepConfig, recipe: str, summaries: dict) -> tuple[float | None, list[float]]:
  """(best rate so far or None if some seed-0 run is missing, the rates to run next); a recipe
  in `fixed_lrs` always gets its fixed rate and no grid."""
  if cfg.fixed_lr(recipe) is not None:
    return cfg.fixed_lr(recipe), []  # chosen elsewhere: seeds 0.. all run at it
  lrs = sorted(set(cfg.lrs))
  best = None
  for _ in range(MAX_EXTENSIONS + 1):
    missing = [lr for lr in lrs if cfg.run_name(recipe, lr, 0) not in summaries]
    if missing:
      return None, missing
    losses = {lr: final_val(summaries[cfg.run_name(recipe, lr, 0)]) for lr in lrs}
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


def parse_fixed_lrs(text: str) -> dict[str, float]:
  """`bf16=0.004,s3r=2e-3` -> {recipe: rate}."""
  out = {}
  for item in filter(None, (t.strip() for t in text.split(","))):
    recipe, sep, rate = item.partition("=")
    try:
      out[recipe.strip()] = float(rate)
    except ValueError:
      sep = ""
    if not sep:
      raise ValueError(
        f"fixed_lrs (--fixed-lrs or the config file): expected recipe=rate pairs such as bf16=0.004, got {item!r}"
      )
  return out
