"""Paired training of several recipes in lockstep, for the paper-scale quality run on one GPU call.

Every recipe starts from the same parameters (same init key), sees the same batch at every step
(one loader) and the same quantizer key stream, and the models advance together: one step of each
per iteration. Validation losses are streamed every `eval_every` steps, so a run stopped at any
point leaves curves of equal length, and the run stops itself before `time_budget` seconds
(compilation included) with a final evaluation of all models at the same step.

Time on a borrowed device is the scarce thing, so:
- the train steps of all recipes compile in parallel threads; the evaluation programs compile in
  the background while training runs (the gradient-error programs compile at the end);
- the learning rate is an argument of the compiled step, so with `fit_budget` the schedule is
  sized after compilation: the iteration time is measured on throw-away copies of the states and
  the run gets a complete warm-up + cosine schedule of the steps that fit (at most `steps`),
  instead of a prefix of a longer one;
- at the end, each recipe's relative gradient errors (dX and dW of block 0, dX of the last block,
  the embedding gradient, against the exact backward of the same INT8 forward) are measured on its
  own final parameters: the dose of rounding noise the run applied (`dose` in the summary); with
  `dose_params_of`, every recipe's errors are also measured on that one recipe's final parameters
  (`dose_same_params`), so that a difference of two recipes' squared errors is an excess variance.

Output folder:
  curves.jsonl   one line per evaluation: step, tokens, elapsed_s, per recipe val (and c4) loss
  summary.json   the paired differences, the curves, the dose and the compile seconds per recipe;
                 rewritten after every evaluation, so a run killed from outside keeps the last one
                 ("complete": false); "complete" is true only when the fitted schedule ran to its
                 end (a run stopped by the time budget, or one that trained nothing, is not)
  summary.md     the same as a report (see lockstep_report.py)
  lockstep.log   progress lines
  resume.json, resume.npz
                 the resume point of the last scheduled evaluation (lockstep_resume.py): a stopped
                 run started again with the same settings continues from there; removed at the end
                 of the schedule. After a resume, elapsed_s counts from the start of its segment
                 (the summary's "resumed" lists each segment's first step and provenance)

Token data (`build-tokens`): train.npy / val.npy / c4.npy (uint16), tokenizer.json, meta.json,
small enough to travel with the device's working-tree copy (see research/docs/quality-at-scale.md).

Dimension letters: B batch, S sequence.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

import jax
import numpy as np

from labtools import executables
from labtools import results as provenance
from labtools.lockstep import lower_train_step as lower_abstract_train_step
from labtools.lockstep import model_config, one_device_mesh, unit_rate  # shared with the AOT benchmark
from research import gradients, lockstep_resume
from research.lockstep_config import LockstepConfig, build_tokens, load_tokens
from research.lockstep_report import finite, write_summary
from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r.train import attention
from s3r.train.run import compile_cache
from s3r.train.step import init_state, make_eval_step
from s3r.train.step.optimizer import OptimizerConfig, make_optimizer, schedule

# --- the run --------------------------------------------------------------------------------------


def fitted_schedule(cfg: LockstepConfig, seconds_left: float, iteration_s: float, eval_round_s: float) -> tuple:
  """(steps, warm-up) of the longest complete schedule (at most cfg.steps) whose iterations, its
  evaluations (every eval_every steps and at the end) and the margin fit in `seconds_left`."""
  steps = cfg.steps
  while steps > 1:
    evals = steps // cfg.eval_every + (steps % cfg.eval_every != 0)
    if steps * iteration_s + evals * eval_round_s + cfg.margin <= seconds_left:
      break
    steps = max(1, int(steps * 0.97))
  return steps, min(steps, round(cfg.warmup * steps / cfg.steps))


def lower_train_step(mcfg, tx, init_key: jax.Array, batch: int, seq: int) -> tuple:
  """(initial state, lowered train step) of one model on the first device; the step takes (state,
  tokens, key, lr) and donates the state. It is lowered from abstract arguments, as `python -m
  benchmarks aot --program lockstep` lowers it for a GPU target, so a program compiled there can be
  recognised here (`--precompiled`)."""
  mesh = one_device_mesh(jax.devices()[0])
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = jax.jit(lambda k: init_state(s3r_model.init_params(mcfg, k), tx), out_shardings=replicated)(init_key)
  return state, lower_abstract_train_step(mcfg, tx, mesh, batch, seq)


def timed_compile(lowered) -> tuple:
  """(compiled program, seconds the compilation took on the calling thread)."""
  t0 = time.monotonic()
  compiled = lowered.compile()
  return compiled, time.monotonic() - t0


class _Models:
  """The compiled steps and the states of every recipe (identical initial parameters)."""

  def __init__(self, cfg: LockstepConfig, vocab_size: int, attention: str, log=print):
    self.cfgs = {
      r: model_config(cfg.preset, r, vocab_size, cfg.seq, attention, cfg.tp_partial_sums) for r in cfg.recipes
    }
    self.opt = OptimizerConfig(lr=cfg.lr, total_steps=cfg.steps, warmup_steps=cfg.warmup)
    tx = make_optimizer(unit_rate(self.opt))
    init_key, self.train_key, self.eval_key = jax.random.split(jax.random.key(cfg.seed), 3)
    batch = jax.ShapeDtypeStruct((cfg.batch, cfg.seq + 1), np.int32)
    self.states, lowered, self.lower_s, self.train = {}, {}, {}, {}
    for r, mcfg in self.cfgs.items():  # tracing on this thread, XLA compiles in parallel below
      t0 = time.monotonic()
      self.states[r], lowered[r] = lower_train_step(mcfg, tx, init_key, cfg.batch, cfg.seq)
      self.lower_s[r] = time.monotonic() - t0
    self.loaded = {}  # recipe -> seconds to load its program compiled ahead of time
    if cfg.precompiled:
      for r in list(lowered):
        t0 = time.monotonic()
        program, why = executables.load(pathlib.Path(cfg.precompiled), r, lowered[r])
        if program is None:
          log(f"{r}: compiling here ({why})")
          continue
        self.loaded[r], self.train[r] = time.monotonic() - t0, program
        log(f"{r}: loaded the program compiled ahead of time from {cfg.precompiled} in {self.loaded[r]:.1f}s")
        del lowered[r]
    self.pool = concurrent.futures.ThreadPoolExecutor(max(1, cfg.compile_threads or len(cfg.recipes)))
    compiled = dict(zip(lowered, self.pool.map(timed_compile, lowered.values())))
    self.train.update({r: c for r, (c, _) in compiled.items()})
    self.compile_s = {r: s for r, (_, s) in compiled.items()}  # each thread's own compile time
    sums = {
      r: float(sum(np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(s.params)))
      for r, s in self.states.items()
    }
    if len(set(sums.values())) != 1:
      raise RuntimeError(f"initial parameters differ between recipes: {sums}")
    self.param_count = s3r_model.param_count(next(iter(self.cfgs.values())))
    # Evaluation programs compile in the background while training starts. They are lowered
    # against the parameters' shapes, not the arrays, which the train steps donate meanwhile.
    param_shapes = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.states[cfg.recipes[0]].params
    )
    self.eval_compile_s = {}
    self._eval = {r: self.pool.submit(self._compile_eval, r, param_shapes, batch) for r in cfg.recipes}
    self._reference_fn = None

  def _compile_eval(self, recipe: str, param_shapes, batch):
    lowered = jax.jit(make_eval_step(s3r_model.graphdef(self.cfgs[recipe]))).lower(param_shapes, batch, self.eval_key)
    compiled, self.eval_compile_s[recipe] = timed_compile(lowered)
    return compiled

  def iteration_seconds(self, batch_BxS1: np.ndarray) -> float:
    """Seconds of one lockstep iteration, timed (after one untimed call) on copies of the states."""
    total = 0.0
    for r, step in self.train.items():
      state = jax.tree.map(lambda x: x.copy() if hasattr(x, "copy") else x, self.states[r])
      state, _ = jax.block_until_ready(step(state, batch_BxS1, self.train_key, np.float32(0)))
      t0 = time.monotonic()
      jax.block_until_ready(step(state, batch_BxS1, self.train_key, np.float32(0)))
      total += time.monotonic() - t0
    return total

  def step(self, batch_BxS1: jax.Array | np.ndarray, lr: float) -> dict[str, float]:
    metrics = {}
    for r in self.train:
      self.states[r], metrics[r] = self.train[r](self.states[r], batch_BxS1, self.train_key, np.float32(lr))
    return {r: float(m["loss"]) for r, m in jax.device_get(metrics).items()}

  def evaluate(self, val_sets: dict[str, list[np.ndarray]]) -> dict[str, dict[str, list[float]]]:
    """{set: {recipe: per-batch losses}}."""
    evals = {r: f.result() for r, f in self._eval.items()}
    out = {}
    for name, batches in val_sets.items():
      per = {r: [evals[r](self.states[r].params, b, self.eval_key) for b in batches] for r in evals}
      out[name] = {r: [float(x) for x in jax.device_get(v)] for r, v in per.items()}
    return out

  def _reference(self):
    if self._reference_fn is None:  # compiled once per batch shape, shared by every measurement
      self._reference_fn = gradients.probe_gradients_fn(next(iter(self.cfgs.values())), gradients.REFERENCE)
    return self._reference_fn

  def dose(self, batch_BxS1: np.ndarray, n_keys: int, log=print) -> dict:
    """{recipe: relative gradient errors} on each recipe's own current parameters."""
    return {
      r: gradients.relative_errors(
        self.cfgs[r], self.states[r].params, batch_BxS1, [r], n_keys=n_keys, log=log, reference_fn=self._reference()
      )[r]
      for r in self.cfgs
    }

  def dose_same_params(self, params_of: str, batch_BxS1: np.ndarray, n_keys: int, log=print) -> dict:
    """{recipe: relative gradient errors} of every recipe on the current parameters of `params_of`."""
    params = self.states[params_of].params
    cfg = self.cfgs[params_of]
    return gradients.relative_errors(
      cfg, params, batch_BxS1, list(self.cfgs), n_keys=n_keys, log=log, reference_fn=self._reference()
    )


def _record(step: int, cfg: LockstepConfig, evals: dict, train_losses: dict) -> dict:
  rec = {
    "step": step,
    "tokens": step * cfg.batch * cfg.seq,
    "elapsed_s": 0.0,
    "train_loss": {r: finite(v) for r, v in train_losses.items()},
  }
  for name, per in evals.items():
    key = "val" if name == "val" else f"val_{name}"
    rec[key] = {r: finite(float(np.mean(v))) for r, v in per.items()}
  rec["val_batches"] = evals["val"]
  return rec


def resolve_attention(cfg: LockstepConfig, vocab_size: int, log=print) -> tuple[str, str | None]:
  """(attention_impl, note): cuDNN on GPUs when `auto` and it compiles at this preset's shapes."""
  max_seq = max(s3r_model.PRESETS[cfg.preset].max_seq_len, cfg.seq)
  mcfg = s3r_model.preset(cfg.preset, vocab_size=vocab_size, max_seq_len=max_seq)
  impl, note = attention.resolve(cfg.attention, mcfg, batch=cfg.batch, seq=cfg.seq)
  if note:
    log(note)
  return impl, note


def run(cfg: LockstepConfig, *, log=print, t_start: float | None = None) -> dict:
  """Trains the recipes in lockstep until the schedule ends or the time budget; returns the summary."""
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
  vocab = int(meta_tokens["vocab_size"])
  attention, attention_note = resolve_attention(cfg, vocab, log)
  loads = compile_cache.loads()
  models = _Models(cfg, vocab, attention, log)
  compile_s, loads = elapsed(), compile_cache.loads() - loads
  cached = f" ({loads} of them from the compilation cache {jax.config.jax_compilation_cache_dir})" if loads else ""
  recipes = f"{len(cfg.recipes)} recipes"
  log(f"{cfg.preset} ({models.param_count:,} parameters) x {recipes} compiled in {compile_s:.1f}s{cached}")
  log(
    "train step per recipe: "
    + ", ".join(f"{r} traced {models.lower_s[r]:.1f}s, compiled {s:.1f}s" for r, s in models.compile_s.items())
  )
  log(f"XLA_FLAGS: {os.environ.get('XLA_FLAGS') or '(none)'}")
  resumed = lockstep_resume.load(out, cfg, models.states)
  segments = [{"step": 0, "meta": provenance.run_metadata()}]
  if resumed is not None:
    models.states = resumed["states"]
    loader.restore(resumed["loader"])
    segments = [*resumed["segments"], {"step": resumed["step"], "meta": segments[0]["meta"]}]
    log(f"resumed at step {resumed['step']} from {out / 'resume.json'}")
  dose_batch = val_sets["val"][0][: cfg.dose_batch]
  iteration_s = models.iteration_seconds(val_sets["val"][0])
  eval_round_s = iteration_s / 3 * sum(len(v) for v in val_sets.values())  # a forward is about a third of a step
  dose_s = (cfg.dose_keys + 1) * iteration_s * cfg.dose_batch / cfg.batch if cfg.dose_keys else 0.0
  dose_s *= 2 if cfg.dose_params_of else 1
  steps, warmup = cfg.steps, cfg.warmup
  if resumed is not None:  # the schedule the run started with
    steps, warmup = resumed["schedule"]["steps"], resumed["schedule"]["warmup"]
  elif cfg.fit_budget:
    steps, warmup = fitted_schedule(cfg, cfg.time_budget - elapsed() - dose_s, iteration_s, eval_round_s)
    log(f"schedule fitted to the budget: {steps} steps (warm-up {warmup}) at {iteration_s:.3f}s per iteration")
  lr_at = schedule(dataclasses.replace(models.opt, total_steps=steps, warmup_steps=warmup))
  summary: dict[str, Any] = {
    "config": dataclasses.asdict(cfg),
    "schedule": {"steps": steps, "warmup": warmup, "fitted": cfg.fit_budget},
    "attention": {"impl": attention, "note": attention_note},
    "param_count": models.param_count,
    "data": meta_tokens,
    "meta": segments[0]["meta"],  # the first segment's; the later ones under "resumed"
    "resumed": segments[1:],
    "compile_s": round(compile_s, 2),
    "compile_s_by_recipe": {r: round(v, 2) for r, v in models.compile_s.items()},  # each thread's own
    "loaded_s_by_recipe": {r: round(v, 2) for r, v in models.loaded.items()},  # compiled ahead, loaded here
    "lower_s_by_recipe": {r: round(v, 2) for r, v in models.lower_s.items()},  # tracing, one after another
    "eval_compile_s_by_recipe": None,  # filled at the end (they compile in the background)
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "iteration_s_calibrated": iteration_s,
  }
  records, iter_times, step, train_sum = [], [], 0, dict.fromkeys(cfg.recipes, 0.0)
  if resumed is not None:
    records, iter_times, step = resumed["records"], resumed["iter_times"], resumed["step"]
  curves = (out / "curves.jsonl").open("w")
  for rec in records:
    curves.write(json.dumps({k: v for k, v in rec.items() if k != "val_batches"}) + "\n")
  write = lambda ended, stopped_by, dose=None, dose_same=None: write_summary(
    out,
    summary,
    records,
    cfg.recipes,
    step,
    iter_times,
    ended=ended,
    stopped_by=stopped_by,
    dose=dose,
    dose_same_params=dose_same,
  )

  def evaluate_now(reason: str):
    nonlocal eval_round_s
    t0 = time.monotonic()
    since = step - (records[-1]["step"] if records else 0)
    rec = _record(step, cfg, models.evaluate(val_sets), {r: v / max(since, 1) for r, v in train_sum.items()})
    eval_round_s = time.monotonic() - t0
    rec["elapsed_s"] = round(elapsed(), 2)
    records.append(rec)
    curves.write(json.dumps({k: v for k, v in rec.items() if k != "val_batches"}) + "\n")
    curves.flush()
    train_sum.update(dict.fromkeys(cfg.recipes, 0.0))
    log(f"step {step} ({reason}, {rec['elapsed_s']:.0f}s): " + ", ".join(f"{r} {v:.4f}" for r, v in rec["val"].items()))
    write(False, None)
    if step < steps:
      lockstep_resume.save(
        out,
        cfg,
        step=step,
        states=models.states,
        loader=loader.state(),
        schedule={"steps": steps, "warmup": warmup},
        records=records,
        iter_times=iter_times,
        segments=segments,
      )

  stopped_by = "steps"
  while step < steps:
    it = float(np.median(iter_times)) if iter_times else iteration_s
    if elapsed() + it + eval_round_s + dose_s + cfg.margin > cfg.time_budget:
      stopped_by = "time_budget"
      break
    t0 = time.monotonic()
    losses = models.step(np.asarray(loader.next()), float(lr_at(step)))
    iter_times.append(time.monotonic() - t0)
    step += 1
    for r, v in losses.items():
      train_sum[r] += v
    if step % cfg.eval_every == 0 or step == steps:
      evaluate_now("scheduled")
  if step > 0 and (not records or records[-1]["step"] != step):
    evaluate_now("stop")
  curves.close()
  log(f"stopped by {stopped_by} at step {step} of {steps} after {elapsed():.0f}s")
  dose = dose_same = None
  if cfg.dose_keys and step > 0 and elapsed() + dose_s + cfg.margin / 2 <= cfg.time_budget + cfg.margin:
    log(f"gradient errors on the final parameters ({cfg.dose_keys} keys, {cfg.dose_batch} sequences):")
    dose = models.dose(dose_batch, cfg.dose_keys, log=log)
    if cfg.dose_params_of:
      log(f"gradient errors of every recipe on the final parameters of {cfg.dose_params_of}:")
      errors = models.dose_same_params(cfg.dose_params_of, dose_batch, cfg.dose_keys, log=log)
      dose_same = {"params_of": cfg.dose_params_of, "errors": errors}
  elif cfg.dose_keys:
    log("gradient errors skipped: no time left in the budget")
  models.pool.shutdown(wait=False, cancel_futures=True)
  summary["eval_compile_s_by_recipe"] = {r: round(v, 2) for r, v in models.eval_compile_s.items()}
  summary["meta"]["loadavg_after"] = provenance.loadavg()
  final = write(True, stopped_by, dose, dose_same)
  if step == steps:
    lockstep_resume.clear(out)
  if not final["complete"]:
    log(f"INCOMPLETE: {step} of the schedule's {steps} steps ran (stopped by {stopped_by})")
  return final


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
  t_start = time.monotonic()
  p = argparse.ArgumentParser(prog="python -m research.lockstep", description=__doc__.split("\n")[0])
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
      r.add_argument(flag, default=",".join(LockstepConfig.recipes), help="comma-separated recipes")
    elif isinstance(f.default, bool):
      r.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
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
    paper = "–" if d["paper"] is None else f"{d['paper']:+.3f}"
    print(f"{name}: {d['final']} (eval se {d['eval_se']}) at step {d['final_step']}; paper {paper}")
  print(f"report: {out / 'summary.md'}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
