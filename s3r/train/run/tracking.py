"""Where a run's per-step records go: metrics.jsonl, TensorBoard event files and Weights & Biases.

`RunOutputs` takes each record the loop writes (`report.MetricsWriter`'s JSON objects) and passes it to

- metrics.jsonl (always; it is what --resume reads back and what the event files are derived from);
- TensorBoard event files in the run folder (`events.out.tfevents.*`, by default when tensorboardX is
  installed: `pip install 's3r[tensorboard]'`; `TrainConfig.tensorboard` False turns them off). The writer
  is tensorboardX: it needs only numpy and protobuf, where TensorBoard's own writer comes with the whole
  TensorBoard server and clu's with TensorFlow. An event file cannot be truncated, so a resumed run
  rewrites the run's event files from metrics.jsonl (which it has already cut back to the restored step)
  and appends from there: the events hold each step once, as metrics.jsonl does;
- Weights & Biases (`TrainConfig.wandb`, a project name; `pip install 's3r[wandb]'`), files under
  <out>/wandb. A resumed run continues the same W&B run (its id is kept in <out>/wandb/s3r-run-id) and
  sends only the steps after the last one the run had recorded, since a W&B run's steps only go forward:
  the steps a resume trains again (identical losses, new timings) keep their first values there.

Tags (TensorBoard) and keys (W&B): `train/loss`, `train/lr`, `train/grad_norm` (and the MoE metrics under
`train/`), `val/loss` (`val/loss_c4`, ... per validation set), `perf/tokens_per_s`, `perf/step_time_s`,
`perf/tflops_per_s_per_device`, `perf/mfu`; the x axis is the step.
"""

from __future__ import annotations

import importlib.util
import pathlib
import secrets
import time

from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import report

EVENTS_GLOB = "events.out.tfevents.*"
PERF_KEYS = ("tokens_per_s", "step_time_s", "tflops_per_s_per_device", "mfu")
NOT_SCALARS = ("step", "wall_s")
WANDB_ID_FILE = "wandb/s3r-run-id"


def tag(key: str) -> str:
  """The TensorBoard tag (and W&B key) of a metrics key: val_loss_c4 -> val/loss_c4, mfu -> perf/mfu."""
  if key.startswith("val_"):
    return "val/" + key.removeprefix("val_")
  return ("perf/" if key in PERF_KEYS else "train/") + key


def scalars(record: dict) -> dict[str, float]:
  """The tagged scalars of one metrics record (its step and wall time are not scalars)."""
  return {tag(k): float(v) for k, v in record.items() if k not in NOT_SCALARS and isinstance(v, (int, float))}


def has_tensorboard_writer() -> bool:
  """Whether tensorboardX (the optional extra `s3r[tensorboard]`) is installed."""
  return importlib.util.find_spec("tensorboardX") is not None


def check_trackers(cfg: TrainConfig) -> None:
  """ConfigError naming --wandb when it is asked for without the wandb package (before anything runs)."""
  if cfg.wandb is not None and importlib.util.find_spec("wandb") is None:
    raise ConfigError(f"--wandb {cfg.wandb}: the wandb package is not installed (pip install 's3r[wandb]')")


class RunOutputs:
  """Process 0's sinks of the per-step records (module docstring). On resume (`keep_until_step` >= 0),
  metrics.jsonl keeps the records up to that step, and the event files are rewritten from them."""

  def __init__(self, cfg: TrainConfig, out: pathlib.Path, *, keep_until_step: int, log):
    # W&B cannot take a step back: a resume sends it only the steps after the last one it already has
    sent = [r.get("step", 0) for r in report.read_metrics(out / report.METRICS_FILE, tolerant=True)]
    self.wandb_from = max(sent) + 1 if sent and keep_until_step >= 0 and (out / WANDB_ID_FILE).exists() else 0
    self.metrics = report.MetricsWriter(out / report.METRICS_FILE, keep_until_step=keep_until_step)
    self.events = None
    if cfg.tensorboard and has_tensorboard_writer():
      kept = report.read_metrics(out / report.METRICS_FILE, tolerant=True)
      self.events = _events_from(out, kept)
      rewritten = f"; the events of steps 0-{kept[-1]['step']} rewritten from metrics.jsonl" if kept else ""
      log(f"tensorboard: {out} (open with: tensorboard --logdir {out}){rewritten}")
    elif cfg.tensorboard:
      log("tensorboard: not written (needs tensorboardX: pip install 's3r[tensorboard]')")
    self.wandb = _wandb_run(cfg, out, log) if cfg.wandb is not None else None

  def write(self, record: dict) -> None:
    self.metrics.write(record)
    values = scalars(record)
    if self.events is not None:
      _add_step(self.events, record["step"], values, time.time())
    if self.wandb is not None and record["step"] >= self.wandb_from:
      self.wandb.log(values, step=record["step"], commit=True)

  def close(self) -> None:
    """Flushes and closes the event file and the W&B run."""
    if self.events is not None:
      self.events.close()
      self.events = None
    if self.wandb is not None:
      self.wandb.finish()
      self.wandb = None


def _events_from(out: pathlib.Path, records: list[dict]):
  """A tensorboardX writer of a new event file in `out` that holds `records` (the run so far): older event
  files are removed (they may hold steps after the restored one)."""
  from tensorboardX import SummaryWriter

  for old in out.glob(EVENTS_GLOB):
    old.unlink()
  writer = SummaryWriter(logdir=str(out), flush_secs=10)
  start = time.time() - max((r.get("wall_s", 0.0) for r in records), default=0.0)
  for r in records:  # wall times of the past steps from their wall_s (the run's clock)
    _add_step(writer, r["step"], scalars(r), start + r.get("wall_s", 0.0))
  writer.flush()
  return writer


def _add_step(writer, step: int, values: dict[str, float], walltime: float) -> None:
  """One event holding all scalars of a step (what `add_scalar` writes one event per value for: the same
  values, several times faster to write and to read back)."""
  summary_pb2 = importlib.import_module("tensorboardX.proto.summary_pb2")  # generated protobuf code, untyped
  value = summary_pb2.Summary.Value
  summary = summary_pb2.Summary(value=[value(tag=name, simple_value=v) for name, v in values.items()])
  writer._get_file_writer().add_summary(summary, global_step=step, walltime=walltime)  # noqa: SLF001


def _wandb_run(cfg: TrainConfig, out: pathlib.Path, log):
  """A W&B run in project `cfg.wandb` with files under <out>/wandb, the same run again on --resume."""
  import wandb

  id_file = out / WANDB_ID_FILE
  id_file.parent.mkdir(parents=True, exist_ok=True)
  run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(8)
  id_file.write_text(run_id)
  run = wandb.init(project=cfg.wandb, id=run_id, resume="allow", dir=str(out), name=out.name, config=cfg.to_dict())
  log(f"wandb: project {cfg.wandb}, run {run_id} (files in {out / 'wandb'})")
  return run
