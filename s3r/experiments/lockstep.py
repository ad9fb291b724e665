"""Paired training of several recipes in lockstep, for the paper-scale quality run on one GPU call.

Every recipe starts from the same parameters (same init key), sees the same batch at every step
(one loader) and the same quantizer key stream, and the models advance together: one step of each
per iteration. Validation losses are streamed every `eval_every` steps, so a run stopped at any
point leaves curves of equal length, and the run stops itself before `time_budget` seconds
(compilation included) with a final evaluation of all models at the same step.

Output folder:
  curves.jsonl   one line per evaluation: step, tokens, elapsed_s, per recipe val (and c4) loss
  summary.json   the paired differences and the curves; rewritten after every evaluation, so a
                 run killed from outside keeps the last one ("complete": false)
  lockstep.log   progress lines

Token data (`build-tokens`): train.npy / val.npy / c4.npy (uint16), tokenizer.json, meta.json,
small enough to travel with the device's working-tree copy (see docs/quality-at-scale.md).

Dimension letters: B batch, S sequence.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import time

import jax
import numpy as np

from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r import results as provenance
from s3r.train.optimizer import OptimizerConfig, make_optimizer, schedule
from s3r.train.step import init_state, make_eval_step, make_train_step

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
LAYOUT_FILES = ("train.npy", "val.npy", "meta.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockstepConfig:
  """One lockstep run (what the `run` flags set)."""

  data: str  # folder written by `build-tokens`
  out: str  # output folder (curves.jsonl, summary.json, lockstep.log)
  preset: str = "paper-12l"  # model preset (s3r.model.PRESETS); the vocabulary is the token folder's
  recipes: tuple[str, ...] = ("int8_sr", "s3r", "s3r_ec_dx")  # recipes trained side by side
  steps: int = 2000  # length of the learning-rate schedule (and most steps run)
  batch: int = 8  # sequences per step
  seq: int = 2048  # tokens per sequence
  lr: float = 6e-4  # peak learning rate, the same for every recipe
  warmup: int = 200  # linear warm-up steps (then cosine decay to lr/10 at `steps`)
  seed: int = 0  # parameters, quantizer keys and batch order
  eval_every: int = 250  # validation every N steps (and at the stop)
  eval_batches: int = 16  # fixed validation batches per set
  time_budget: float = 420.0  # seconds from the start (compilation included) after which no step starts
  margin: float = 10.0  # seconds kept free for the last evaluation and the files

  def __post_init__(self):
    if self.preset not in s3r_model.PRESETS:
      raise ValueError(f"LockstepConfig.preset must be one of {', '.join(s3r_model.PRESETS)}; got {self.preset!r}")
    if len(set(self.recipes)) != len(self.recipes) or len(self.recipes) < 2:
      raise ValueError(f"LockstepConfig.recipes must be at least two distinct recipes, got {self.recipes!r}")
    for field in ("steps", "batch", "seq", "eval_every", "eval_batches"):
      value = getattr(self, field)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"LockstepConfig.{field} must be an int >= 1, got {value!r}")
    if not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
      raise ValueError(f"LockstepConfig.warmup must be an int in [0, steps={self.steps}], got {self.warmup!r}")
    for field in ("lr", "time_budget"):
      if not getattr(self, field) > 0:
        raise ValueError(f"LockstepConfig.{field} must be > 0, got {getattr(self, field)!r}")


# --- token folder -------------------------------------------------------------------------------


def build_tokens(
  out: str, *, data: str | None, vocab: int, cache_dir: str, max_train_tokens: int | None, log=print
) -> dict:
  """Tokenize `data` (None: enwiki, shards 0-8 train, shard 9 val) with the project's tokenizer and
  write the token folder; the training stream is cut to `max_train_tokens` (whole stream if None)."""
  corpus = s3r_data.prepare(data, vocab_size=vocab, cache_dir=cache_dir, log=log)
  folder = pathlib.Path(out)
  folder.mkdir(parents=True, exist_ok=True)
  dtype = np.uint16 if corpus.tokenizer.vocab_size <= 65536 else np.int32
  train = np.asarray(corpus.train_tokens[:max_train_tokens], dtype)
  np.save(folder / "train.npy", train)
  for name, tokens in corpus.val_tokens.items():
    np.save(folder / f"{name}.npy", np.asarray(tokens, dtype))
  (folder / "tokenizer.json").write_text(corpus.tokenizer.hf.to_str())
  sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
  meta = {
    "corpus": corpus.name,
    "split": corpus.info["split"],
    "vocab_size": corpus.tokenizer.vocab_size,
    "dtype": np.dtype(dtype).name,
    "n_tokens": {"train": int(len(train)), **{k: int(len(v)) for k, v in corpus.val_tokens.items()}},
    "train_tokens_available": int(len(corpus.train_tokens)),
    "bytes": sizes,
  }
  (folder / "meta.json").write_text(json.dumps(meta, indent=2))
  log(f"token folder {folder}: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))
  return meta


def load_tokens(folder: str) -> tuple[dict, np.ndarray, dict[str, np.ndarray]]:
  """(meta, train tokens, {validation set: tokens}) of a token folder."""
  path = pathlib.Path(folder)
  missing = [f for f in LAYOUT_FILES if not (path / f).is_file()]
  if missing:
    raise FileNotFoundError(
      f"token folder {folder} lacks {', '.join(missing)}; build it with "
      f"`python -m s3r.experiments.lockstep build-tokens`"
    )
  meta = json.loads((path / "meta.json").read_text())
  val = {p.stem: np.load(p, mmap_mode="r") for p in sorted(path.glob("*.npy")) if p.stem != "train"}
  return meta, np.load(path / "train.npy", mmap_mode="r"), val


# --- the run --------------------------------------------------------------------------------------


class _Models:
  """The compiled train/eval steps and the states of every recipe (identical initial parameters)."""

  def __init__(self, cfg: LockstepConfig, vocab_size: int):
    base = s3r_model.PRESETS[cfg.preset]
    self.cfgs = {
      r: s3r_model.preset(cfg.preset, vocab_size=vocab_size, recipe=r, max_seq_len=max(base.max_seq_len, cfg.seq))
      for r in cfg.recipes
    }
    opt = OptimizerConfig(lr=cfg.lr, total_steps=cfg.steps, warmup_steps=cfg.warmup)
    tx = make_optimizer(opt)
    init_key, self.train_key, self.eval_key = jax.random.split(jax.random.key(cfg.seed), 3)
    batch = jax.ShapeDtypeStruct((cfg.batch, cfg.seq + 1), np.int32)
    self.states, self.train, self.eval = {}, {}, {}
    for r, mcfg in self.cfgs.items():
      graphdef = s3r_model.graphdef(mcfg)
      self.states[r] = jax.jit(lambda k, mcfg=mcfg: init_state(s3r_model.init_params(mcfg, k), tx))(init_key)
      step = jax.jit(make_train_step(graphdef, tx, schedule(opt)), donate_argnums=0)
      self.train[r] = step.lower(self.states[r], batch, self.train_key).compile()
      self.eval[r] = jax.jit(make_eval_step(graphdef)).lower(self.states[r].params, batch, self.eval_key).compile()
    sums = {
      r: float(sum(np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(s.params)))
      for r, s in self.states.items()
    }
    if len(set(sums.values())) != 1:
      raise RuntimeError(f"initial parameters differ between recipes: {sums}")
    self.param_count = s3r_model.param_count(next(iter(self.cfgs.values())))

  def step(self, batch_BxS1: jax.Array) -> dict[str, float]:
    metrics = {}
    for r in self.train:
      self.states[r], metrics[r] = self.train[r](self.states[r], batch_BxS1, self.train_key)
    return {r: float(m["loss"]) for r, m in jax.device_get(metrics).items()}

  def evaluate(self, val_sets: dict[str, list[np.ndarray]]) -> dict[str, dict[str, list[float]]]:
    """{set: {recipe: per-batch losses}}."""
    out = {}
    for name, batches in val_sets.items():
      per = {r: [self.eval[r](self.states[r].params, b, self.eval_key) for b in batches] for r in self.eval}
      out[name] = {r: [float(x) for x in jax.device_get(v)] for r, v in per.items()}
    return out


def _finite(x: float) -> float | None:
  return x if math.isfinite(x) else None


def paired(records: list[dict], recipes: tuple[str, ...], steps_done: int) -> dict:
  """Per pair (a, b) of PAIRS present in the run: a - b at every evaluation, the final difference
  with its eval-sampling standard error (paired over the fixed batches) and the mean over the last
  quarter of the evaluated steps."""
  out = {}
  for a, b in PAIRS:
    if a not in recipes or b not in recipes or not records:
      continue
    diffs = [r["val"][a] - r["val"][b] if None not in (r["val"][a], r["val"][b]) else None for r in records]
    last = records[-1]["val_batches"]
    d_batches = np.asarray(last[a], np.float64) - np.asarray(last[b], np.float64)
    se = float(np.std(d_batches, ddof=1) / math.sqrt(len(d_batches))) if len(d_batches) > 1 else None
    late = [d for r, d in zip(records, diffs) if d is not None and r["step"] >= 0.75 * steps_done]
    out[f"{a} - {b}"] = {
      "final": diffs[-1],
      "final_step": records[-1]["step"],
      "eval_se": _finite(se) if se is not None else None,
      "last_quarter_mean": float(np.mean(late)) if late else None,
      "curve": diffs,
      "paper": round(PAPER_LOSS[a] - PAPER_LOSS[b], 3),
    }
  return out


def _record(step: int, cfg: LockstepConfig, elapsed: float, evals: dict, train_losses: dict) -> dict:
  rec = {
    "step": step,
    "tokens": step * cfg.batch * cfg.seq,
    "elapsed_s": round(elapsed, 2),
    "train_loss": {r: _finite(v) for r, v in train_losses.items()},
  }
  for name, per in evals.items():
    key = "val" if name == "val" else f"val_{name}"
    rec[key] = {r: _finite(float(np.mean(v))) for r, v in per.items()}
  rec["val_batches"] = evals["val"]
  return rec


def run(cfg: LockstepConfig, *, log=print, t_start: float | None = None) -> dict:
  """Trains the recipes in lockstep until `cfg.steps` or the time budget; returns the summary."""
  t_start = time.monotonic() if t_start is None else t_start
  elapsed = lambda: time.monotonic() - t_start
  out = pathlib.Path(cfg.out)
  out.mkdir(parents=True, exist_ok=True)
  meta_tokens, train_tokens, val_tokens = load_tokens(cfg.data)
  loader = s3r_data.BatchLoader(train_tokens, batch_size=cfg.batch, seq_len=cfg.seq, seed=cfg.seed)
  val_sets = {
    name: list(s3r_data.eval_batches(t, batch_size=cfg.batch, seq_len=cfg.seq, max_batches=cfg.eval_batches))
    for name, t in val_tokens.items()
  }
  models = _Models(cfg, int(meta_tokens["vocab_size"]))
  compile_s = elapsed()
  log(f"{cfg.preset} ({models.param_count:,} parameters) x {len(cfg.recipes)} recipes compiled in {compile_s:.1f}s")
  summary = {
    "config": dataclasses.asdict(cfg),
    "param_count": models.param_count,
    "data": meta_tokens,
    "meta": provenance.run_metadata(),
    "compile_s": round(compile_s, 2),
    "one_seed": ONE_SEED,
  }
  records, iter_times, eval_s, step, train_sum = [], [], None, 0, dict.fromkeys(cfg.recipes, 0.0)
  curves = (out / "curves.jsonl").open("w")

  def evaluate_now(reason: str):
    nonlocal eval_s
    t0 = time.monotonic()
    rec = _record(
      step,
      cfg,
      0.0,
      models.evaluate(val_sets),
      {r: v / max(step - (records[-1]["step"] if records else 0), 1) for r, v in train_sum.items()},
    )
    eval_s = time.monotonic() - t0
    rec["elapsed_s"] = round(elapsed(), 2)
    records.append(rec)
    curves.write(json.dumps({k: v for k, v in rec.items() if k != "val_batches"}) + "\n")
    curves.flush()
    train_sum.update(dict.fromkeys(cfg.recipes, 0.0))
    log(f"step {step} ({reason}, {rec['elapsed_s']:.0f}s): " + ", ".join(f"{r} {v:.4f}" for r, v in rec["val"].items()))
    _write_summary(out, summary, records, cfg, step, iter_times, complete=False, stopped_by=None)

  stopped_by = "steps"
  while step < cfg.steps:
    it = float(np.median(iter_times)) if iter_times else 0.0
    # Before the first measured evaluation, a forward pass is taken as a third of a train step.
    ev = eval_s if eval_s is not None else it / 3 * sum(len(v) for v in val_sets.values())
    if elapsed() + it + ev + cfg.margin > cfg.time_budget:
      stopped_by = "time_budget"
      break
    t0 = time.monotonic()
    losses = models.step(np.asarray(loader.next()))
    iter_times.append(time.monotonic() - t0)
    step += 1
    for r, v in losses.items():
      train_sum[r] += v
    if step % cfg.eval_every == 0 or step == cfg.steps:
      evaluate_now("scheduled")
  if step > 0 and (not records or records[-1]["step"] != step):
    evaluate_now("stop")
  curves.close()
  log(f"stopped by {stopped_by} at step {step} after {elapsed():.0f}s")
  return _write_summary(out, summary, records, cfg, step, iter_times, complete=True, stopped_by=stopped_by)


def _write_summary(out, summary, records, cfg, step, iter_times, *, complete, stopped_by) -> dict:
  summary = {
    **summary,
    "complete": complete,
    "stopped_by": stopped_by,
    "steps_done": step,
    "iteration_s_median": float(np.median(iter_times)) if iter_times else None,
    "iteration_s_first": iter_times[0] if iter_times else None,
    "curves": {
      "step": [r["step"] for r in records],
      **{
        k: {rc: [r[k][rc] for r in records] for rc in cfg.recipes}
        for k in (records[0] if records else {})
        if k.startswith("val") and k != "val_batches"
      },
    },
    "paired": paired(records, cfg.recipes, step),
  }
  provenance.write_json(out / "summary.json", summary)
  return summary


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
  t_start = time.monotonic()
  p = argparse.ArgumentParser(prog="python -m s3r.experiments.lockstep", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  b = sub.add_parser("build-tokens", help="tokenize a corpus into a folder that can travel to the device")
  b.add_argument("--out", default=".cache/device_tokens")
  b.add_argument("--data", default=None, help="corpus (default: enwiki, shard 9 validation)")
  b.add_argument("--vocab", type=int, default=32000)
  b.add_argument("--cache-dir", default=".cache/s3r")
  b.add_argument("--max-train-tokens", type=int, default=24_000_000)
  r = sub.add_parser("run", help="train the recipes in lockstep")
  fields = {f.name: f for f in dataclasses.fields(LockstepConfig)}
  for name, f in fields.items():
    flag = "--" + name.replace("_", "-")
    if name == "recipes":
      r.add_argument(flag, default=",".join(f.default), help="comma-separated recipes")
    elif f.default is dataclasses.MISSING:
      r.add_argument(flag, required=True)
    else:
      r.add_argument(flag, type=type(f.default), default=f.default)
  args = p.parse_args(argv)
  if args.command == "build-tokens":
    build_tokens(
      args.out, data=args.data, vocab=args.vocab, cache_dir=args.cache_dir, max_train_tokens=args.max_train_tokens
    )
    return 0
  values = {name: getattr(args, name) for name in fields}
  values["recipes"] = tuple(x for x in values["recipes"].split(",") if x)
  out = pathlib.Path(values["out"])
  out.mkdir(parents=True, exist_ok=True)
  with (out / "lockstep.log").open("a") as logf:

    def log(msg):
      print(msg, flush=True)
      logf.write(msg + "\n")
      logf.flush()

    summary = run(LockstepConfig(**values), log=log, t_start=t_start)
  for name, d in summary["paired"].items():
    print(f"{name}: {d['final']} (eval se {d['eval_se']}) at step {d['final_step']}; paper {d['paper']:+.3f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
