"""The training I/O loop: data, compiled steps, validation, checkpoints, metrics, plot.

`train(cfg)` runs (or resumes) one run and writes into `cfg.out`:
  config.json      the run config, the model config and the corpus summary
  metrics.jsonl    one line per step: step, loss, lr, grad_norm, tokens_per_s, step_time_s,
                   plus val_loss (and val_loss_c4, ...) on validation steps
  loss.png         train and validation loss curves (at the end)
  checkpoints/     Orbax checkpoints every `ckpt_every` steps and at the end
`evaluate_checkpoint(path)` computes the validation losses of a saved run.

PRNG keys: key(seed) is split into init (parameters), train (quantizer randomness, folded
with the step number) and eval (forward-only passes need a key for stochastic recipes but
draw nothing from it).

Several processes (after `jax.distributed.initialize`, see `s3r train --coordinator` and
docs/scaling.md): every process runs `train(cfg)` with the same config; the mesh spans the
devices of all processes; each process loads only the rows of every global batch that its
own devices hold (`Batches`) and all of them take part in checkpointing, while process 0
alone writes metrics.jsonl, config.json, loss.png and logs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import time
from typing import Callable

import jax
import numpy as np
import tokenizers
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r.train import checkpoint, report, sharding
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.optimizer import make_optimizer, schedule
from s3r.train.step import TrainState, init_state, make_eval_step, make_train_step


class TrainingDiverged(RuntimeError):
  """The loss or the gradient norm became non-finite."""


@dataclasses.dataclass(frozen=True)
class Setup:
  """The compiled pieces of a run, built from its config and vocabulary."""

  model_cfg: s3r_model.ModelConfig
  mesh: jax.sharding.Mesh
  batch_sharding: NamedSharding
  abstract_state: TrainState  # ShapeDtypeStructs with shardings
  init_state: Callable  # init_key -> TrainState
  train_step: Callable  # (state, batch, train_key) -> (state, metrics); donates state
  eval_step: Callable  # (params, batch, eval_key) -> loss
  keys: dict  # "init", "train", "eval"


def is_main_process() -> bool:
  """True in process 0 (the only one that writes metrics, config, plots and logs)."""
  return jax.process_index() == 0


class Batches:
  """Global batch arrays [B, S+1] built from the rows this process's devices hold.

  The batch is sharded over (data, fsdp); the devices of this process hold a contiguous
  range of rows [start, stop) (the mesh is laid out process by process), so the process
  loads just those rows: the BatchLoader's process slice `start // (stop - start)` of
  `B // (stop - start)`, and `jax.make_array_from_process_local_data` assembles the global
  array. One process: the whole batch.
  """

  def __init__(self, sharding: NamedSharding, shape: tuple[int, int]):
    self.sharding, self.shape = sharding, tuple(shape)
    rows = sorted({(i[0].start or 0, shape[0] if i[0].stop is None else i[0].stop)
                   for i in sharding.addressable_devices_indices_map(self.shape).values()})
    self.start, self.stop = rows[0][0], rows[-1][1]
    n = self.stop - self.start
    if any(a > b_prev for (_, b_prev), (a, _) in zip(rows, rows[1:])) or shape[0] % n or self.start % n:
      raise ConfigError(f"the devices of process {jax.process_index()} hold rows {rows} of the batch, not one "
                        f"contiguous block of an even split; use a mesh whose data x fsdp axes follow the processes")
    self.rows = self.stop - self.start
    self.slice_index, self.slice_count = self.start // self.rows, shape[0] // self.rows

  def loader(self, tokens, *, seed: int) -> s3r_data.BatchLoader:
    """A BatchLoader that returns this process's rows of every global batch."""
    return s3r_data.BatchLoader(tokens, batch_size=self.shape[0], seq_len=self.shape[1] - 1, seed=seed,
                                process_index=self.slice_index, process_count=self.slice_count)

  def from_local(self, rows: np.ndarray) -> jax.Array:
    """The global array from this process's rows (as the loader returns them)."""
    return jax.make_array_from_process_local_data(self.sharding, np.asarray(rows), self.shape)

  def from_global(self, batch: np.ndarray) -> jax.Array:
    """The global array from a whole batch that every process has (validation batches)."""
    return self.from_local(np.asarray(batch)[self.start:self.stop])


def make_mesh(cfg: TrainConfig) -> jax.sharding.Mesh:
  """The mesh of `cfg.mesh`, checked against the devices and the batch size (ConfigError if not)."""
  try:
    mesh = sharding.make_mesh(sharding.parse_mesh(cfg.mesh, jax.device_count()))
    sharding.batch_sharding(mesh, (cfg.batch, cfg.seq + 1))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return mesh


def build(cfg: TrainConfig, vocab_size: int, mesh: jax.sharding.Mesh, **model_overrides) -> Setup:
  """Model, shardings and the jitted init/train/eval functions of `cfg` on `mesh`.

  `model_overrides` replace fields of the model config (e.g. n_layers=2 for `s3r comm`)."""
  model_cfg = dataclasses.replace(cfg.model_config(vocab_size), **model_overrides)
  batch_sh = sharding.batch_sharding(mesh, (cfg.batch, cfg.seq + 1))
  tx = make_optimizer(cfg.optimizer_config())
  graphdef = s3r_model.graphdef(model_cfg)
  fresh = lambda key: init_state(s3r_model.init_params(model_cfg, key), tx)
  shapes = jax.eval_shape(fresh, jax.random.key(0))
  state_sh = sharding.state_shardings(mesh, model_cfg, shapes, tx)
  replicated = NamedSharding(mesh, P())
  constrained = lambda fn: sharding.with_activation_sharding(fn, mesh)
  train_step = jax.jit(constrained(make_train_step(graphdef, tx, schedule(cfg.optimizer_config()))),
                       in_shardings=(state_sh, batch_sh, replicated), out_shardings=(state_sh, replicated),
                       donate_argnums=0)
  eval_step = jax.jit(constrained(make_eval_step(graphdef)), in_shardings=(state_sh.params, batch_sh, replicated),
                      out_shardings=replicated)
  init_key, train_key, eval_key = jax.random.split(jax.random.key(cfg.seed), 3)
  return Setup(model_cfg=model_cfg, mesh=mesh, batch_sharding=batch_sh,
               abstract_state=checkpoint.abstract_like(shapes, state_sh),
               init_state=jax.jit(fresh, out_shardings=state_sh), train_step=train_step, eval_step=eval_step,
               keys={"init": init_key, "train": train_key, "eval": eval_key})


def prepare_data(cfg: TrainConfig, log=print) -> s3r_data.Corpus:
  return s3r_data.prepare(cfg.data, vocab_size=cfg.vocab, cache_dir=cfg.cache_dir,
                          max_train_docs=cfg.max_train_docs, log=log)


def validation_batches(corpus_val: dict, cfg: TrainConfig, log=print) -> dict[str, list[np.ndarray]]:
  """Up to `eval_batches` fixed batches per validation set; sets too small for one batch are skipped."""
  out = {}
  for name, tokens in corpus_val.items():
    try:
      out[name] = list(s3r_data.eval_batches(tokens, batch_size=cfg.batch, seq_len=cfg.seq,
                                             max_batches=cfg.eval_batches))
    except s3r_data.DataError as e:
      if name == "val":
        raise
      log(f"validation set {name!r} skipped: {e}")
  return out


def evaluate(setup: Setup, params, val_sets: dict[str, list[np.ndarray]]) -> dict[str, float]:
  """Mean token loss on each validation set (whole batches, present in every process)."""
  losses = {}
  for name, batches in val_sets.items():
    place = Batches(setup.batch_sharding, batches[0].shape)
    per_batch = [setup.eval_step(params, place.from_global(b), setup.keys["eval"]) for b in batches]
    losses[name] = float(np.mean(jax.device_get(per_batch)))
  return losses


def _start(cfg: TrainConfig, setup: Setup, ckpt: checkpoint.Checkpointer, loader: s3r_data.BatchLoader, log):
  """The initial TrainState: fresh, or restored from the latest checkpoint when resuming."""
  latest = ckpt.latest_step()
  if latest is not None and not cfg.resume:
    raise ConfigError(f"{ckpt.directory} already has checkpoints (latest: step {latest}); "
                      f"pass --resume to continue that run or choose another --out")
  if latest is None:
    if cfg.resume:
      log(f"resume: no checkpoint in {ckpt.directory}; starting from step 0")
    return setup.init_state(setup.keys["init"])
  saved = TrainConfig.from_dict(ckpt.read_meta(latest)["train_config"])
  if mismatches := cfg.resume_mismatches(saved):
    raise ConfigError("--resume with a different configuration than the checkpoint: " + "; ".join(mismatches))
  state, meta = ckpt.restore(setup.abstract_state, latest)
  loader.restore(meta["loader"])
  log(f"resume: restored step {latest} from {ckpt.directory / str(latest)}")
  return state


def train(cfg: TrainConfig, *, log=print) -> dict:
  """Runs (or resumes) the training run `cfg`; returns a summary (final losses, paths, time).

  With several processes, every process calls this with the same `cfg` (see the module docstring).
  """
  t_start = time.time()
  main = is_main_process()
  log = log if main else _quiet
  out = pathlib.Path(cfg.out)
  mesh = make_mesh(cfg)
  out.mkdir(parents=True, exist_ok=True)
  corpus = _prepare_data_once(cfg, log)
  setup = build(cfg, corpus.tokenizer.vocab_size, mesh)
  batches = Batches(setup.batch_sharding, (cfg.batch, cfg.seq + 1))
  loader = batches.loader(corpus.train_tokens, seed=cfg.seed)
  val_sets = validation_batches(corpus.val_tokens, cfg, log)
  ckpt = checkpoint.Checkpointer(out / checkpoint.CHECKPOINT_DIR)
  state = _start(cfg, setup, ckpt, loader, log)
  start = int(state.step)
  meta = lambda: {"train_config": cfg.to_dict(), "model_config": setup.model_cfg.to_dict(),
                  "loader": loader.state(), "tokenizer": corpus.tokenizer.hf.to_str(), "mesh": dict(setup.mesh.shape),
                  "process_count": jax.process_count()}
  writer = None
  if main:
    _write_config(out, cfg, setup, corpus)
    writer = report.MetricsWriter(out / report.METRICS_FILE, keep_until_step=start)
  processes = f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
  log(f"model: {cfg.preset} ({s3r_model.param_count(setup.model_cfg):,} parameters), recipe {cfg.recipe}, "
      f"mesh {dict(setup.mesh.shape)}{processes}; steps {start}->{cfg.steps}, batch {cfg.batch} x seq {cfg.seq}")
  train_step = _compile(setup, state, cfg, log) if start < cfg.steps else None
  val_losses, last_ckpt = {}, None
  bar = tqdm(total=cfg.steps, initial=start, disable=not (cfg.progress and main), unit="step", dynamic_ncols=True)
  for step in range(start + 1, cfg.steps + 1):
    t0 = time.time()
    state, metrics = train_step(state, batches.from_local(loader.next()), setup.keys["train"])
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    step_time = time.time() - t0
    if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
      bar.close()
      raise TrainingDiverged(_divergence_message(step, metrics, last_ckpt, ckpt))
    record = {"step": step, **metrics, "tokens_per_s": cfg.batch * cfg.seq / step_time, "step_time_s": step_time}
    if step % cfg.eval_every == 0 or step == cfg.steps:
      val_losses = evaluate(setup, state.params, val_sets)
      record.update({report.val_key(k): v for k, v in val_losses.items()})
      if main:
        bar.write(f"step {step}: loss {metrics['loss']:.4f}, " +
                  ", ".join(f"{report.val_key(k)} {v:.4f}" for k, v in val_losses.items()))
    if writer is not None:
      writer.write(record)
    if step % cfg.ckpt_every == 0 or step == cfg.steps:
      last_ckpt = ckpt.save(step, state, meta())
    bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
    bar.update(1)
  bar.close()
  ckpt.close()
  if not main:
    return {"val_losses": val_losses, "checkpoint": str(last_ckpt) if last_ckpt else None,
            "seconds": time.time() - t_start, "process_index": jax.process_index()}
  return _finish(cfg, out, val_losses, last_ckpt, time.time() - t_start, log)


def _quiet(*_):
  pass


def _prepare_data_once(cfg: TrainConfig, log) -> s3r_data.Corpus:
  """The corpus; with several processes, process 0 prepares (and caches) it first, and every
  process checks that it has the same tokenizer and token counts as process 0."""
  if jax.process_count() == 1:
    return prepare_data(cfg, log)
  from jax.experimental import multihost_utils

  corpus = prepare_data(cfg, log) if is_main_process() else None
  multihost_utils.sync_global_devices("s3r: corpus prepared")
  if corpus is None:
    corpus = prepare_data(cfg, log)
  digest = hashlib.sha256(corpus.tokenizer.hf.to_str().encode())
  digest.update(np.asarray([len(corpus.train_tokens)] + [len(v) for v in corpus.val_tokens.values()]).tobytes())
  mine = np.frombuffer(digest.digest()[:8], np.int64)
  every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)
  if not np.all(every == every[0]):
    raise ConfigError("the processes prepared different corpora or tokenizers; give every process the same "
                      "--data and a shared --cache-dir")
  return corpus


def _write_config(out: pathlib.Path, cfg: TrainConfig, setup: Setup, corpus: s3r_data.Corpus) -> None:
  data = {k: corpus.info[k] for k in ("name", "split", "n_docs", "n_tokens", "vocab_size")}
  (out / "config.json").write_text(json.dumps(
      {"train": cfg.to_dict(), "model": setup.model_cfg.to_dict(), "param_count": s3r_model.param_count(setup.model_cfg),
       "mesh": dict(setup.mesh.shape), "data": data}, indent=2))


def _compile(setup: Setup, state: TrainState, cfg: TrainConfig, log):
  """The train step compiled ahead of time (so that step times exclude compilation)."""
  t0 = time.time()
  batch = jax.ShapeDtypeStruct((cfg.batch, cfg.seq + 1), np.int32, sharding=setup.batch_sharding)
  compiled = setup.train_step.lower(state, batch, setup.keys["train"]).compile()
  log(f"compiled the train step in {time.time() - t0:.1f}s")
  return compiled


def _divergence_message(step: int, metrics: dict, last_ckpt, ckpt: checkpoint.Checkpointer) -> str:
  what = "loss" if not math.isfinite(metrics["loss"]) else "gradient norm"
  where = (f"{last_ckpt} is the last good checkpoint" if last_ckpt
           else f"no checkpoint was written in this session (latest: step {ckpt.latest_step()})")
  return f"non-finite {what} at step {step} (loss {metrics['loss']}, grad_norm {metrics['grad_norm']}); stopping: {where}"


def _finish(cfg: TrainConfig, out: pathlib.Path, val_losses: dict, last_ckpt, seconds: float, log) -> dict:
  records = report.read_metrics(out / report.METRICS_FILE)
  plot = report.plot_losses(records, out / report.PLOT_FILE, title=f"{cfg.preset} / {cfg.recipe}")
  if not val_losses:  # nothing left to train: report the last validation losses on file
    val_losses = {k.removeprefix("val_loss_") if k != "val_loss" else "val": v
                  for r in records for k, v in r.items() if k.startswith("val_loss")}
  final = ", ".join(f"{report.val_key(k)} {v:.4f}" for k, v in val_losses.items())
  log(f"final validation loss: {final or 'n/a'}")
  log(f"loss curve: {plot}")
  return {"val_losses": val_losses, "plot": str(plot), "metrics": str(out / report.METRICS_FILE),
          "checkpoint": str(last_ckpt) if last_ckpt else None, "seconds": seconds,
          "final_loss": records[-1]["loss"] if records else None}


def open_run(path: str) -> tuple[checkpoint.Checkpointer, TrainConfig, dict]:
  """(checkpointer, run config, checkpoint meta) of the latest checkpoint under `path`
  (a run directory or its checkpoints/ folder); ConfigError if there is none."""
  directory = checkpoint.find_checkpoint_dir(path)
  if not directory.is_dir():
    raise ConfigError(f"no checkpoint directory at {path}")
  ckpt = checkpoint.Checkpointer(directory, create=False)
  if ckpt.latest_step() is None:
    raise ConfigError(f"no checkpoint in {directory}")
  meta = ckpt.read_meta()
  return ckpt, TrainConfig.from_dict(meta["train_config"]), meta


def evaluate_checkpoint(path: str, *, data: str | None = None, max_batches: int | None = None,
                        log=print) -> dict[str, float]:
  """Validation losses of the latest checkpoint under `path` (a run or its checkpoints/ folder).

  Without `data` (or with the run's own corpus), the run's validation sets ("val", "c4");
  otherwise every document of `data`, encoded with the run's tokenizer.
  """
  ckpt, cfg, meta = open_run(path)
  directory = ckpt.directory
  if max_batches is not None:
    cfg = dataclasses.replace(cfg, eval_batches=max_batches)
  tok = s3r_data.Tokenizer(tokenizers.Tokenizer.from_str(meta["tokenizer"]))
  if data is None or data == cfg.data:
    corpus = prepare_data(cfg, log)
    if corpus.tokenizer.hf.to_str() != meta["tokenizer"]:
      raise ConfigError(f"the tokenizer prepared for {cfg.data or 'the default corpus'} differs from the run's")
    val = corpus.val_tokens
  else:
    docs = list(s3r_data.read_documents(data))
    val = {"val": np.concatenate([np.asarray(ids + [tok.eot_id], np.int32) for ids in tok.encode_batch(docs)])}
  setup = build(cfg, tok.vocab_size, make_mesh(dataclasses.replace(cfg, mesh=None)))
  state, _ = ckpt.restore(setup.abstract_state)
  ckpt.close()
  log(f"eval: step {int(state.step)} of {directory}")
  return evaluate(setup, state.params, validation_batches(val, cfg, log))
