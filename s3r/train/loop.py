"""The training loop: data, the compiled step, validation, checkpoints, metrics, plot.

`train(cfg)` runs (or resumes) one run and writes into `cfg.out`:
  config.json      the run config, the model config and the corpus summary
  metrics.jsonl    one line per step from step 0 (the initial loss on the first batch and the
                   validation losses before any update): step, loss, lr, grad_norm, tokens_per_s,
                   tflops_per_s_per_device and mfu (model FLOPs, s3r.train.flops; mfu where the device's
                   peak is known), step_time_s, wall_s (wall-clock seconds of the run, carried across --resume),
                   plus val_loss (and val_loss_c4, ...) on validation steps; MoE models add
                   load_balance_loss (weighted, summed over the MoE layers; `loss` is the
                   cross-entropy without it) and dropped_fraction (capacity drops) on steps >= 1
  loss.png         train and validation loss curves (at the end, and when the run stops early)
  events.out.tfevents.*  the same scalars for TensorBoard; wandb/ with --wandb (s3r.train.run.tracking)
  profile/         with --profile, the jax.profiler trace of those steps (s3r.train.run.profiling)
  tokenizer/       with --init-from: the checkpoint's tokenizer files (what `s3r export` writes beside the weights)
  checkpoints/     Orbax checkpoints every `ckpt_every` steps, at the end and on Ctrl-C (the last two,
                   and the newest known-good one: s3r.train.run.recovery)
  train.log        the libraries' logs (s3r.train.run.logs)
  diverged/<step>/ after a divergence at <step>: the checkpoints written after the known-good one

Resuming (`cfg.resume`) continues the run `s3r.train.run.resume.find_run` reads in `cfg.out` (once:
the newest checkpoint with a readable meta, damaged newer ones reported and skipped) and refuses
a folder without a run; only RESUMABLE_CHANGES and a larger `steps` may differ from the run's
config, and the corpus must be the run's (the same tokenizer and training tokens). A larger
`steps` extends the run: the cosine decay is stretched to the new total from the resumed step on. A
lower `lr` is recorded as a schedule change from the resumed step on (`TrainConfig.lr_changes`).

Safety (s3r.train.run.guard): one training per run directory (a lock), Ctrl-C saves and stops
(`TrainingInterrupted`; a second Ctrl-C waits for a save in progress, and otherwise stops at
once naming the latest intact checkpoint), a non-finite, blown-up or fast-rising loss or a zero
gradient norm stops the run (`TrainingDiverged`, naming the checkpoint known to be good and the
command to continue from it), a train step that needs more memory than is free is refused
before it runs and a full disk during a save stops the run without a partial checkpoint
(`ResourceError`), and a run directory created by a run that failed before its first metrics
line is removed again.

Several processes (after `jax.distributed.initialize`, see `s3r train --coordinator` and
docs/scaling.md): every process runs `train(cfg)` with the same config; each loads only its
rows of every batch (s3r.train.run.placement) and all of them take part in checkpointing, while
process 0 alone writes metrics.jsonl, config.json, loss.png and logs and holds the lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable

import jax
from tqdm.auto import tqdm

from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r.model.hf.save import copy_tokenizer_files
from s3r.train import flops
from s3r.train.builder import (  # noqa: F401
  ResourceError,
  Setup,
  build,
  check_microbatches,
  compile_eval_step_on_first_use,
  compile_train_step,
  make_mesh,
  prepare_data,
)
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.evaluate import evaluate, evaluate_checkpoint, open_run, validation_batches  # noqa: F401
from s3r.train.run import checkpoint, compile_cache, logs, peers, placement, profiling, recovery, report, resume
from s3r.train.run.guard import (
  DivergenceMonitor,
  Interrupts,
  RunLock,
  TrainingDiverged,
  TrainingInterrupted,
  param_name,
)
from s3r.train.run.placement import Batches, is_main_process
from s3r.train.run.tracking import RunOutputs, check_trackers
from s3r.train.step import FIRST_NONFINITE_GRAD

TOKENIZER_DIR = "tokenizer"  # <out>/tokenizer/: the tokenizer files of the --init-from checkpoint

__all__ = [
  "ResourceError",
  "TrainingDiverged",
  "TrainingInterrupted",
  "build",
  "evaluate_checkpoint",
  "make_mesh",
  "open_run",
  "prepare_data",
  "train",
]


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
  """`cfg` with `cache_dir` and `init_from`, and `data` when it is an existing path, made absolute, so that a
  saved config finds its token cache, corpus and imported checkpoint from any directory (`s3r eval`)."""
  data, init_from = cfg.data, cfg.init_from
  if data is not None and not s3r_data.sources.has_glob(data) and os.path.exists(os.path.expanduser(data)):
    data = os.path.abspath(os.path.expanduser(data))
  if init_from is not None:
    init_from = os.path.abspath(os.path.expanduser(init_from))
  cache_dir = os.path.abspath(os.path.expanduser(cfg.cache_dir))
  return dataclasses.replace(cfg, data=data, cache_dir=cache_dir, init_from=init_from)


def train(cfg: TrainConfig, *, saved: resume.SavedRun | None = None, log=print) -> dict:
  """Runs (or resumes) the training run `cfg`; returns a summary (final losses, paths, time).

  With `cfg.resume`, `saved` is the run in `cfg.out` (`resume.find_run`, read here when not given); a
  folder without a run is a ConfigError, and nothing is created. With several processes, every process
  calls this with the same `cfg` (see the module docstring).
  """
  main = is_main_process()
  log = log if main else _quiet
  cfg = absolute_paths(cfg)
  out = pathlib.Path(cfg.out)
  saved = (saved or resume.find_run(out)) if cfg.resume else None
  try:
    mesh = make_mesh(cfg)
  except ConfigError as e:
    raise ConfigError(f"{e}; {resume.mesh_hint(cfg)}") from None
  check_microbatches(cfg, mesh)
  _writable_dir(pathlib.Path(cfg.cache_dir), "--cache-dir")
  check_trackers(cfg)
  if cfg.compile_cache:  # a repeated or resumed run loads its compiled programs (--no-compile-cache: never)
    compile_cache.enable(os.path.join(cfg.cache_dir, "xla"))
  else:
    compile_cache.disable()
  created = _writable_dir(out, "--out")
  log_file = out / (logs.LOG_FILE if main else f"{logs.LOG_FILE}.{jax.process_index()}")
  try:
    with RunLock(out) if main else contextlib.nullcontext(), logs.library_logs(log_file, verbose=cfg.verbose):
      return _train(cfg, out, mesh, saved, main, log)
  except BaseException:
    if created and main:
      _remove_if_unused(out)
    raise


def _writable_dir(path: pathlib.Path, flag: str) -> bool:
  """Creates `path` (and parents) and checks that it is writable; whether it created it.
  ConfigError naming `flag` if it is a file or cannot be written."""
  if path.exists() and not path.is_dir():
    raise ConfigError(f"{flag} {path} is an existing file, not a directory")
  existed = path.is_dir()
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    raise ConfigError(f"{flag} {path} is not writable: {e.strerror or e}") from None
  return not existed


def _remove_if_unused(out: pathlib.Path) -> None:
  """Removes a run directory this run created when it holds no metrics line and no checkpoint."""
  ckpts = out / checkpoint.CHECKPOINT_DIR
  if report.read_metrics(out / report.METRICS_FILE, tolerant=True) or (ckpts.is_dir() and any(ckpts.iterdir())):
    return
  shutil.rmtree(out, ignore_errors=True)


def _train(cfg: TrainConfig, out: pathlib.Path, mesh, saved: resume.SavedRun | None, main: bool, log) -> dict:
  t_start = time.time()
  ckpt = checkpoint.Checkpointer(out / checkpoint.CHECKPOINT_DIR, keep_every=cfg.keep_every)
  writer: RunOutputs | None = None  # process 0's metrics.jsonl, TensorBoard and W&B
  try:
    resume_step = _resume_step(cfg, ckpt, saved, log)
    if resume_step is not None and saved is not None:
      cfg = resume.record_lr_change(cfg, saved.config, resume_step, log)
    corpus = placement.prepare_data_once(cfg, log)
    if resume_step is not None and saved is not None and saved.meta is not None:
      resume.check_corpus(cfg, corpus, saved.meta)
    setup = build(cfg, corpus.tokenizer.vocab_size, mesh)
    # Compiled (and its memory checked) before any batch or state is built.
    train_step = compile_train_step(setup, cfg, log) if resume_step is None or resume_step < cfg.steps else None
    batches = Batches(setup.batch_sharding, cfg.batch_shape)
    loader = batches.loader(corpus.train_tokens, seed=cfg.seed)
    val_sets = validation_batches(corpus.val_tokens, cfg, log)
    eval_step = compile_eval_step_on_first_use(setup, cfg, log)
    state, wall_before = resume.initial_state(setup, ckpt, loader, resume_step, log)
    start = int(state.step)
    if train_step is None and start < cfg.steps:  # resumed from before a damaged final checkpoint
      train_step = compile_train_step(setup, cfg, log)
    wall = lambda: wall_before + time.time() - t_start
    meta = lambda: _checkpoint_meta(cfg, setup, loader, corpus, wall())
    if main:
      _write_config(out, cfg, setup, corpus)
      # a start from step 0 (a fresh run, or one stopped before its first checkpoint) writes step 0 anew
      writer = RunOutputs(cfg, out, keep_until_step=start if start else -1, log=log)
    throughput = _log_start(cfg, setup, start, log)
    history, initial_val = [], None
    peers.watch().gather("compiled")  # no process starts the first collective long before the others
    if start == 0:
      initial_loss, record = _step_zero(setup, state, batches, loader, val_sets, eval_step)
      history, initial_val = [initial_loss], record.get("val_loss")
      if writer is not None:
        writer.write({**record, "wall_s": wall()})
    else:
      history = placement.loss_history(out, start, main)
    fields = (cfg, setup, ckpt, batches, loader, val_sets, eval_step, writer, meta, wall, main, log, initial_val)
    run = _Run(*fields, throughput=throughput)
    val_losses, last_ckpt = run.steps(state, start, train_step, DivergenceMonitor.following(history))
    if start >= cfg.steps:  # nothing left to train: the final losses are the restored state's, computed now
      log(f"resume: the run is at step {start} of {cfg.steps} already; no step to run (raise --steps to train on)")
      val_losses = evaluate(setup, state.params, val_sets, eval_step=eval_step)
  except (TrainingDiverged, TrainingInterrupted):
    if main:
      _plot(cfg, out)
    raise
  finally:
    ckpt.close()
    if writer is not None:
      writer.close()
  if not main:
    return {
      "val_losses": val_losses,
      "checkpoint": str(last_ckpt) if last_ckpt else None,
      "seconds": time.time() - t_start,
      "process_index": jax.process_index(),
    }
  return _finish(cfg, out, val_losses, last_ckpt, time.time() - t_start, wall(), log)


def _checkpoint_meta(cfg: TrainConfig, setup, loader, corpus, wall_s: float) -> dict:
  """What a checkpoint records beside the state: enough to resume and to read the run back."""
  return {
    "train_config": cfg.to_dict(),
    "model_config": setup.model_cfg.to_dict(),
    "loader": loader.state(),
    "tokenizer": corpus.tokenizer.hf.to_str(),
    "eot": corpus.tokenizer.eot,
    "bos": corpus.tokenizer.bos,
    "mesh": dict(setup.mesh.shape),
    "process_count": jax.process_count(),
    "wall_s": wall_s,
  }


def _log_start(cfg: TrainConfig, setup, start: int, log) -> flops.Throughput:
  """Logs what the run trains and its model FLOPs; returns the throughput meter of its steps."""
  processes = f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
  log(
    f"model: {cfg.model_name} ({s3r_model.param_count(setup.model_cfg):,} parameters), recipe {cfg.recipe}, "
    f"mesh {dict(setup.mesh.shape)}{processes}; steps {start}->{cfg.steps}, batch {cfg.batch} x seq {cfg.seq}"
    + (f" ({cfg.grad_accum} microbatches of {cfg.batch // cfg.grad_accum})" if cfg.grad_accum > 1 else "")
  )
  throughput = flops.Throughput.of(setup.model_cfg, cfg.seq_len, setup.mesh.devices.flat)
  log(throughput.describe())
  return throughput


@dataclasses.dataclass
class _Run:
  """The pieces the step loop needs."""

  cfg: TrainConfig
  setup: Setup
  ckpt: checkpoint.Checkpointer
  batches: Batches
  loader: s3r_data.BatchLoader
  val_sets: dict
  eval_step: Callable  # (params, batch, key) -> loss, compiled on first use
  writer: RunOutputs | None
  meta: Callable[[], dict]  # () -> checkpoint meta
  wall: Callable[[], float]  # () -> wall-clock seconds of the run so far
  main: bool
  log: Callable[[str], object]
  initial_val: float | None = None  # the step-0 validation loss of this session, if it computed one
  throughput: flops.Throughput | None = None  # achieved TFLOP/s and MFU of each step

  def steps(self, state, start: int, train_step, monitor: DivergenceMonitor):
    """Steps start+1 .. cfg.steps; (last validation losses, last checkpoint path written)."""
    cfg, val_losses, last_ckpt, step = self.cfg, {}, None, start
    good = recovery.GoodCheckpoints(self.ckpt, resumed_from=start)
    good.saw_validation(self.initial_val)
    profiler = profiling.step_profiler(profiling.run_folder(cfg.out), cfg.profile, resumed_at=start, log=self.log)
    bar = tqdm(
      total=cfg.steps, initial=start, disable=not (cfg.progress and self.main), unit="step", dynamic_ncols=True
    )
    profiler.log = self.log if bar.disable else bar.write  # the trace's file named above the progress bar
    watch = peers.watch()  # with several processes: stalls, lost peers and the agreed stop step
    with bar, Interrupts() as interrupts, contextlib.closing(profiler):
      try:
        for step in range(start + 1, cfg.steps + 1):
          watch.begin("step", step)
          t0 = time.time()
          with profiler.step(step):
            state, metrics = train_step(state, self.batches.from_local(self.loader.next()), self.setup.keys["train"])
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            profiler.done(state)
            step_time = time.time() - t0  # without writing a trace that ends after this step
          bad_grad = param_name(state.params, int(metrics.pop(FIRST_NONFINITE_GRAD, -1)))
          level = monitor.level
          if why := monitor.check(step, metrics["loss"], metrics["grad_norm"], bad_grad):
            raise TrainingDiverged(f"{why}; stopping: {recovery.diverged(cfg, self.ckpt, step, main=self.main)}")
          good.healthy(step, metrics["loss"], level)
          record = {
            "step": step,
            **metrics,
            "tokens_per_s": cfg.batch * cfg.seq_len / step_time,
            **(self.throughput.metrics(cfg.batch * cfg.seq_len / step_time) if self.throughput else {}),
            "step_time_s": step_time,
            "wall_s": self.wall(),
          }
          if step % cfg.eval_every == 0 or step == cfg.steps:
            watch.begin("validate", step)
            val_losses = self._validate(bar, step, state, metrics, record)
            good.saw_validation(record.get("val_loss"))
          if self.writer is not None:
            self.writer.write(record)
          # read once: a signal arriving after this line stops the next step (several processes: a later one)
          stop = watch.stop_at(step, interrupts.requested)
          if step % cfg.ckpt_every == 0 or step == cfg.steps or stop:
            watch.begin("save", step)
            with interrupts.deferred():  # a second Ctrl-C waits for the checkpoint
              last_ckpt = self._save(step, state, last_ckpt)
            good.saved(step, monitor.level, record.get("val_loss"))
          watch.begin("end", step)
          bar.set_postfix(
            {"loss": f"{metrics['loss']:.3f}", "tok_s": f"{record['tokens_per_s']:.0f}"}
            | flops.Throughput.postfix(record)
          )
          bar.update(1)
          if stop and step < cfg.steps:
            raise TrainingInterrupted(
              f"{stop} at step {step}: saved {last_ckpt}; continue with s3r train --out {cfg.out} --resume"
            )
      except KeyboardInterrupt:  # a second Ctrl-C outside a save
        raise TrainingInterrupted(
          f"second SIGINT at step {step}: stopped without saving; "
          f"{recovery.latest_intact(self.ckpt, last_ckpt)}; continue with s3r train --out {cfg.out} --resume"
        ) from None
    return val_losses, last_ckpt

  def _validate(self, bar, step: int, state, metrics: dict, record: dict) -> dict:
    """The validation losses of `state` (added to `record`, and printed)."""
    val_losses = evaluate(self.setup, state.params, self.val_sets, eval_step=self.eval_step)
    record.update({report.val_key(k): v for k, v in val_losses.items()})
    if self.main:
      bar.write(
        f"step {step}: loss {metrics['loss']:.4f}, "
        + ", ".join(f"{report.val_key(k)} {v:.4f}" for k, v in val_losses.items())
      )
    return val_losses

  def _save(self, step: int, state, last_ckpt):
    """Checkpoint `step`; a full disk is a ResourceError that names the intact previous checkpoint."""
    try:
      return self.ckpt.save(step, state, self.meta())
    except checkpoint.CheckpointDiskFull as e:
      raise ResourceError(
        f"disk full: {e} (nothing partial was left); {recovery.latest_intact(self.ckpt, last_ckpt)}; "
        f"free space on that disk, then continue with s3r train --out {self.cfg.out} --resume"
      ) from None


def _resume_step(cfg: TrainConfig, ckpt: checkpoint.Checkpointer, saved: resume.SavedRun | None, log) -> int | None:
  """The step to resume from (`saved`'s, checked against the run's config), or None for a fresh start."""
  latest = ckpt.latest_step()
  if latest is not None and not cfg.resume:
    raise ConfigError(
      f"{ckpt.directory} already has checkpoints (latest: step {latest}); "
      f"pass --resume to continue that run or choose another --out"
    )
  if saved is None or saved.step is None:
    if cfg.resume:
      log(f"resume: no checkpoint in {ckpt.directory}; starting from step 0")
    return None
  for note in saved.notes:
    log(note)
  resume.check_config(cfg, dataclasses.replace(saved, config=absolute_paths(saved.config)), log)
  return saved.step


def _step_zero(setup: Setup, state, batches: Batches, loader, val_sets, eval_step) -> tuple[float, dict]:
  """(initial loss, the step-0 metrics record): the loss of the initial parameters on the first training
  batch (the loader is rewound, so training sees the same batches) and the validation losses."""
  position = loader.state()
  first = batches.from_local(loader.next())
  loader.restore(position)
  loss = float(jax.device_get(eval_step(state.params, first, setup.keys["eval"])))
  val = evaluate(setup, state.params, val_sets, eval_step=eval_step)
  return loss, {"step": 0, "loss": loss, "lr": 0.0, **{report.val_key(k): v for k, v in val.items()}}


def _quiet(*_):
  pass


def _write_config(out: pathlib.Path, cfg: TrainConfig, setup: Setup, corpus: s3r_data.Corpus) -> None:
  """config.json; with --init-from, the checkpoint's tokenizer files in tokenizer/ too (for `s3r export`)."""
  if cfg.init_from is not None:
    copy_tokenizer_files(cfg.init_from, out / TOKENIZER_DIR)
  data = {k: corpus.info[k] for k in ("name", "split", "n_docs", "n_tokens", "vocab_size")}
  (out / "config.json").write_text(
    json.dumps(
      {
        "train": cfg.to_dict(),
        "model": setup.model_cfg.to_dict(),
        "param_count": s3r_model.param_count(setup.model_cfg),
        "mesh": dict(setup.mesh.shape),
        "data": data,
      },
      indent=2,
    )
  )


def _plot(cfg: TrainConfig, out: pathlib.Path) -> pathlib.Path | None:
  """The loss-curve PNG, or None without matplotlib (the optional extra `s3r[plots]`)."""
  if not report.can_plot():
    return None
  records = report.read_metrics(out / report.METRICS_FILE, tolerant=True)
  return report.plot_losses(records, out / report.PLOT_FILE, title=f"{cfg.model_name} / {cfg.recipe}")


def _finish(
  cfg: TrainConfig, out: pathlib.Path, val_losses: dict, last_ckpt, seconds: float, wall_s: float, log
) -> dict:
  records = report.read_metrics(out / report.METRICS_FILE)
  plot = _plot(cfg, out)
  final = ", ".join(f"{report.val_key(k)} {v:.4f}" for k, v in val_losses.items())
  log(f"final validation loss (step {cfg.steps}): {final or 'n/a'}")
  log(f"loss curve: {plot}" if plot else "loss curve: not drawn (needs matplotlib: pip install 's3r[plots]')")
  return {
    "val_losses": val_losses,
    "plot": str(plot) if plot else None,
    "metrics": str(out / report.METRICS_FILE),
    "checkpoint": str(last_ckpt) if last_ckpt else None,
    "seconds": seconds,
    "wall_s": wall_s,
    "final_loss": records[-1]["loss"] if records else None,
  }
