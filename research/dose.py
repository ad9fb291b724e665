"""`python -m research.dose`: the dose-response study, lockstep runs at coarser gradient grids.

Hypothesis (research/results/dose/PREDICTIONS.md): a recipe's loss cost follows the excess relative variance
of its parameter gradients over independent SR's, e²(recipe) − e²(int8_sr) of the relative dW error
of block 0. A coarser backward grid raises that dose with nothing else changed. For every (grid,
seed) of the config, one *arm* trains `int8_rtne`, `int8_sr`, `s3r` and `s3r_ec_dx` at that grid
(`NAME@GRID`; plain names at `int8`) in lockstep (research/lockstep.py: same initialization,
same batches, same quantizer key stream). At the end of an arm every recipe's relative gradient
errors are measured twice: on its own final parameters (`dose`), and on the `int8_sr` model's
final parameters (`dose_same_params`), where the difference of two recipes' squared errors is an
excess variance on one set of parameters. The study's x-axis is the latter.

Arms run one at a time and each writes its own folder, `<runs-dir>/<grid>-s<seed>/` (lockstep's
curves.jsonl, summary.json, summary.md, lockstep.log). A complete arm is skipped; an arm stopped
part-way continues from its last scheduled evaluation (lockstep's resume point), the same
computation as an uninterrupted run. After each arm the study's
summary is rewritten from the finished arms: `<results-dir>/dose.json`, `dose.md` and `dose.png`
(research/dose_report.py); the committed files only with `--results-dir research/results`.

Tokens: `--tokens FOLDER` (written by `python -m research.lockstep build-tokens`), else a folder
built once under `<runs-dir>/tokens` from `--data` or, by default, enwiki under the data root
(`$S3R_DATA` or ../shared/data); without either the command stops with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from labtools import results as provenance
from research import dose_report, lockstep
from research.lockstep_config import LAYOUT_FILES
from research.runs import lists_as_tuples, pid_alive
from s3r import model as s3r_model
from s3r.cli import EXIT_CODES
from s3r.data import DataError, sources
from s3r.quant import formats

ARM_TIME_BUDGET = 1e9  # seconds: an arm is never stopped by lockstep's time budget
# LockstepConfig fields that may differ between the run of an arm and a later call without making
# it another experiment (where files are, how many threads compile, whether the train steps were
# compiled ahead of time: such a program is loaded only when its lowering is the one compiled now)
_UNCOMPARED = ("data", "out", "compile_threads", "precompiled")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoseConfig:
  """The study: its grids, seeds and the settings every arm shares (research/configs/dose.json)."""

  grids: tuple[str, ...] = ("int8", "int6", "int4", "nvfp4")  # gradient formats (s3r.quant.formats)
  seeds: int = 2  # seeds 0..seeds-1 per grid
  recipes: tuple[str, ...] = ("int8_rtne", "int8_sr", "s3r", "s3r_ec_dx")  # base names, trained in lockstep
  baseline: str = "int8_sr"  # gaps and excesses are against it, and errors are measured on its parameters
  preset: str = "cpu-small"
  steps: int = 800
  warmup: int = 80
  lr: float = 4e-3
  batch: int = 8
  seq: int = 256
  eval_every: int = 100
  eval_batches: int = 64  # fixed validation batches per set and evaluation
  dose_keys: int = 16  # quantizer keys of the final gradient-error measurements
  dose_batch: int = 8  # validation sequences they use
  data: str | None = None  # corpus of the token folder (None: enwiki under the data root)
  tokens: str | None = None  # a token folder to use as it is (None: <runs_dir>/tokens, built if missing)
  vocab: int = 0  # tokenizer vocabulary of a built token folder (0: the preset's)
  max_train_tokens: int = 24_000_000  # training tokens kept in a built token folder
  cache_dir: str = ".cache/s3r"  # tokenizer and token cache
  runs_dir: str = "runs/dose"  # arm folders
  results_dir: str = "runs/results"  # dose.json, dose.md, dose.png (the committed files: research/results)

  def __post_init__(self):
    from s3r.quant import RECIPES

    if not self.grids or len(set(self.grids)) != len(self.grids):
      raise ValueError(f"DoseConfig.grids must be distinct gradient formats, got {self.grids!r}")
    unknown = [g for g in self.grids if g not in formats.FORMATS]
    if unknown:
      raise ValueError(f"DoseConfig.grids: unknown {unknown}; valid: {', '.join(formats.FORMATS)}")
    bad = [r for r in self.recipes if r not in RECIPES or "@" in r]
    if bad:
      raise ValueError(f"DoseConfig.recipes must be registered base names (no @FORMAT), got {bad}")
    if self.baseline not in self.recipes:
      raise ValueError(f"DoseConfig.baseline must be one of the recipes {list(self.recipes)}, got {self.baseline!r}")
    if self.preset not in s3r_model.PRESETS:
      raise ValueError(f"DoseConfig.preset must be one of {', '.join(s3r_model.PRESETS)}; got {self.preset!r}")
    for field in ("seeds", "steps", "batch", "seq", "eval_every", "eval_batches", "dose_keys", "dose_batch"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"DoseConfig.{field} must be an int >= 1, got {value!r}")
    if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
      raise ValueError(f"DoseConfig.warmup must be an int in [0, steps={self.steps}], got {self.warmup!r}")
    if not self.lr > 0:
      raise ValueError(f"DoseConfig.lr must be > 0, got {self.lr!r}")
    if not isinstance(self.vocab, int) or self.vocab < 0:
      raise ValueError(f"DoseConfig.vocab must be an int >= 0, got {self.vocab!r}")
    lockstep_config(self, self.grids[0], 0, "tokens")  # the arms' own checks (warm-up, rate)


def recipe_at(base: str, grid: str) -> str:
  """The recipe name of `base` at gradient grid `grid`: the plain name at int8, else BASE@GRID."""
  return base if grid == "int8" else f"{base}@{grid}"


def arm_name(grid: str, seed: int) -> str:
  return f"{grid}-s{seed}"


def arms(cfg: DoseConfig) -> list[tuple[str, int]]:
  """(grid, seed) of every arm, seed-major: stopped part-way, the study has whole seeds of grids."""
  return [(grid, seed) for seed in range(cfg.seeds) for grid in cfg.grids]


def lockstep_config(cfg: DoseConfig, grid: str, seed: int, tokens: str) -> lockstep.LockstepConfig:
  """The lockstep run of one arm."""
  return lockstep.LockstepConfig(
    data=tokens,
    out=str(pathlib.Path(cfg.runs_dir) / arm_name(grid, seed)),
    preset=cfg.preset,
    recipes=tuple(recipe_at(r, grid) for r in cfg.recipes),
    steps=cfg.steps,
    batch=cfg.batch,
    seq=cfg.seq,
    lr=cfg.lr,
    warmup=cfg.warmup,
    seed=seed,
    eval_every=cfg.eval_every,
    eval_batches=cfg.eval_batches,
    time_budget=ARM_TIME_BUDGET,
    dose_keys=cfg.dose_keys,
    dose_batch=cfg.dose_batch,
    dose_params_of=recipe_at(cfg.baseline, grid),
    tp_partial_sums="int32",  # one device: the same program as "bf16", and the FP4 grids accept it
  )


# --- arms on disk ----------------------------------------------------------------------------------


def _settings(lcfg: lockstep.LockstepConfig | dict) -> dict:
  d = dataclasses.asdict(lcfg) if isinstance(lcfg, lockstep.LockstepConfig) else lcfg
  return {k: v for k, v in json.loads(json.dumps(d)).items() if k not in _UNCOMPARED}


def finished_arm(lcfg: lockstep.LockstepConfig) -> dict | None:
  """The arm's lockstep summary if it ran to its last step with both gradient-error measurements,
  else None. A finished arm of other settings is refused (ValueError): it is another experiment."""
  path = pathlib.Path(lcfg.out) / "summary.json"
  if not path.is_file():
    return None
  summary = json.loads(path.read_text())
  done = summary.get("complete") and summary.get("stopped_by") == "steps" and summary.get("dose_same_params")
  if not done:
    return None
  want, have = _settings(lcfg), _settings(summary["config"])
  differ = [f"{k}: {have.get(k)!r} there, {v!r} now" for k, v in want.items() if have.get(k) != v]
  if differ:
    raise ValueError(f"arm {lcfg.out} finished with other settings ({'; '.join(differ)}); use another --runs-dir")
  return summary


def finished_arms(cfg: DoseConfig, tokens: str) -> tuple[list[dict], list[str]]:
  """(the finished arms' results for the report, the names of the arms not finished)."""
  results, missing = [], []
  for grid, seed in arms(cfg):
    summary = finished_arm(lockstep_config(cfg, grid, seed, tokens))
    if summary is None:
      missing.append(arm_name(grid, seed))
    else:
      results.append(dose_report.arm_result(grid, seed, summary, cfg.baseline))
  return results, missing


def write_results(cfg: DoseConfig, tokens: str, log=print) -> dict:
  """Rewrites `<results_dir>/dose.{json,md,png}` from the finished arms; returns the summary."""
  results, missing = finished_arms(cfg, tokens)
  meta = {**provenance.run_metadata(), "loadavg_after": provenance.loadavg()}
  summary = dose_report.summarize(dataclasses.asdict(cfg), results, missing=missing, meta=meta, baseline=cfg.baseline)
  paths = dose_report.write(cfg.results_dir, summary, log=log)
  log(f"dose summary ({len(results)} arms finished, {len(missing)} to go): {paths['md']}")
  return summary


# --- tokens ----------------------------------------------------------------------------------------


def token_folder(cfg: DoseConfig, log=print) -> str:
  """The token folder of every arm: `cfg.tokens`, else `<runs_dir>/tokens` (built once from
  `cfg.data`, or enwiki under the data root). DataError when there is no corpus to build it from."""
  if cfg.tokens:
    lockstep.load_tokens(cfg.tokens)  # a missing or partial folder fails here, before any arm
    return cfg.tokens
  folder = pathlib.Path(cfg.runs_dir) / "tokens"
  if all((folder / f).is_file() for f in LAYOUT_FILES):
    return str(folder)
  data = cfg.data
  if data is None:
    root, how = sources.locate_data_root()
    if root is None or not (root / "enwiki").is_dir():
      where = f"{root} has no enwiki/" if root is not None else how
      raise DataError(f"no enwiki corpus ({where}); pass --data CORPUS or --tokens FOLDER")
    data = "enwiki"
  vocab = cfg.vocab or s3r_model.PRESETS[cfg.preset].vocab_size
  log(f"building the token folder {folder} from {data} (vocabulary {vocab})")
  lockstep.build_tokens(
    str(folder), data=data, vocab=vocab, cache_dir=cfg.cache_dir, max_train_tokens=cfg.max_train_tokens, log=log
  )
  return str(folder)


# --- the study -------------------------------------------------------------------------------------


def run_arm(lcfg: lockstep.LockstepConfig, log=print) -> dict:
  """Trains one arm in lockstep (a stopped arm continues from its last resume point)."""
  out = pathlib.Path(lcfg.out)
  if (out / "resume.json").is_file():
    log(f"arm {out.name}: not finished, continuing from its last evaluation")
  elif (out / "summary.json").is_file():
    log(f"arm {out.name}: not finished and no resume point, restarting from step 0")
  out.mkdir(parents=True, exist_ok=True)
  with (out / "lockstep.log").open("a") as logf:

    def arm_log(msg):
      log(f"  {msg}")
      logf.write(msg + "\n")
      logf.flush()

    return lockstep.run(lcfg, log=arm_log)


def study(cfg: DoseConfig, *, max_arms: int | None = None, log=print) -> dict:
  """Runs the arms that are not finished (at most `max_arms`), rewriting the summary after each."""
  tokens = token_folder(cfg, log=log)
  ran = 0
  for grid, seed in arms(cfg):
    lcfg = lockstep_config(cfg, grid, seed, tokens)
    if finished_arm(lcfg) is not None:
      log(f"arm {arm_name(grid, seed)}: finished, skipped")
      continue
    if max_arms is not None and ran >= max_arms:
      break
    log(f"arm {arm_name(grid, seed)}: {', '.join(lcfg.recipes)}, {cfg.steps} steps")
    summary = run_arm(lcfg, log=log)
    if summary["stopped_by"] != "steps" or not summary.get("dose_same_params"):
      raise RuntimeError(f"arm {arm_name(grid, seed)} did not finish (stopped by {summary['stopped_by']})")
    ran += 1
    write_results(cfg, tokens, log=log)
  return write_results(cfg, tokens, log=log)


# --- command line ----------------------------------------------------------------------------------


def config_from_args(args: argparse.Namespace) -> DoseConfig:
  """The config file's fields (if any), with the flags that were given on top."""
  values = json.loads(pathlib.Path(args.config).read_text()) if args.config else {}
  for field in dataclasses.fields(DoseConfig):
    v = getattr(args, field.name, None)
    if v is not None:
      values[field.name] = v
  for field in ("grids", "recipes"):
    if isinstance(values.get(field), str):
      values[field] = tuple(x.strip() for x in values[field].split(",") if x.strip())
  return DoseConfig(**lists_as_tuples(values))


def parser() -> argparse.ArgumentParser:
  d = DoseConfig()
  p = argparse.ArgumentParser(
    prog="python -m research.dose",
    description=__doc__.split("\n")[0].split(": ", 1)[1],
    epilog="Results go to <results-dir>/dose.{json,md,png}; the committed files only with --results-dir "
    "research/results. "
    f"Exit codes: 0 ok, 1 an arm failed, {EXIT_CODES['bad_input']} bad input (flags, config, data), "
    f"{EXIT_CODES['interrupted']} interrupted.",
  )
  p.add_argument("--config", default=None, help="JSON file with DoseConfig fields (flags override it)")
  for field in ("grids", "recipes"):
    p.add_argument(f"--{field}", default=None, help=f"comma-separated (default {','.join(getattr(d, field))})")
  for f in dataclasses.fields(DoseConfig):
    if f.name in ("grids", "recipes"):
      continue
    kind = type(f.default) if f.default is not None else str
    p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, help=f"default {f.default}")
  p.add_argument("--max-arms", type=int, default=None, help="stop after this many arms (default: all)")
  p.add_argument("--report-only", action="store_true", help="only rewrite the summary from the finished arms")
  return p


def main(argv: list[str] | None = None) -> int:
  args = parser().parse_args(argv)
  try:
    cfg = config_from_args(args)
  except (ValueError, TypeError, OSError) as e:
    print(f"dose: error: {e}", file=sys.stderr)
    return EXIT_CODES["bad_input"]
  lock = pathlib.Path(cfg.runs_dir) / "dose.lock"
  try:
    if args.report_only:
      write_results(cfg, cfg.tokens or str(pathlib.Path(cfg.runs_dir) / "tokens"))
      return 0
    lock.parent.mkdir(parents=True, exist_ok=True)
    if lock.exists() and pid_alive(int(lock.read_text() or 0)):
      print(f"dose: error: the study in {cfg.runs_dir} is already running (pid {lock.read_text()})", file=sys.stderr)
      return EXIT_CODES["bad_input"]
    lock.write_text(str(os.getpid()))
    try:
      study(cfg, max_arms=args.max_arms)
    finally:
      lock.unlink(missing_ok=True)
  except (DataError, ValueError, FileNotFoundError) as e:
    print(f"dose: error: {e}", file=sys.stderr)
    return EXIT_CODES["bad_input"]
  except RuntimeError as e:
    print(f"dose: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    return EXIT_CODES["interrupted"]
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
