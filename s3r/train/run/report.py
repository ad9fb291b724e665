"""Run outputs: metrics as JSON Lines and the loss-curve plot."""

from __future__ import annotations

import json
import math
import pathlib

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"


def val_key(name: str) -> str:
  """Metrics key of validation set `name`: "val_loss" for "val", else "val_loss_<name>"."""
  return "val_loss" if name == "val" else f"val_loss_{name}"


def read_metrics(path: str | pathlib.Path, *, tolerant: bool = False) -> list[dict]:
  """The records of a metrics file ([] if there is none); `tolerant` skips lines that are not JSON objects
  (a line cut short when a process was killed while writing it)."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  records = []
  for line in path.read_text(errors="replace").splitlines():
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if tolerant:
        continue
      raise
    if isinstance(record, dict) or not tolerant:
      records.append(record)
  return records


class MetricsWriter:
  """Appends one JSON object per line; on resume, first drops the records after `keep_until_step` (all
  of them for -1) and any second record of a step, so that the file holds each step once."""

  def __init__(self, path: str | pathlib.Path, *, keep_until_step: int = 0):
    self.path = pathlib.Path(path)
    kept: dict[int, dict] = {}
    for r in read_metrics(self.path, tolerant=True):
      if r.get("step", 0) <= keep_until_step:
        kept.setdefault(r.get("step", 0), r)
    self.path.write_text("".join(json.dumps(r) + "\n" for r in kept.values()))

  def write(self, record: dict) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")


def can_plot() -> bool:
  """Whether matplotlib (the optional extra `s3r[plots]`) is installed."""
  import importlib.util

  return importlib.util.find_spec("matplotlib") is not None


def plot_losses(records: list[dict], path: str | pathlib.Path, *, title: str = "") -> pathlib.Path:
  """Train loss (raw and smoothed) and every validation loss against the step, saved as PNG."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train = [(r["step"], r["loss"]) for r in records if math.isfinite(r.get("loss", math.nan))]
  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
  if train:
    steps, losses = zip(*train)
    ax.plot(steps, losses, color="tab:blue", alpha=0.3, lw=0.8, label="train")
    window = max(1, len(losses) // 40)
    ax.plot(steps, _trailing_mean(losses, window), color="tab:blue", lw=1.5, label=f"train (mean of {window})")
  val_keys = sorted({k for r in records for k in r if k.startswith("val_loss")})
  for key, color in zip(val_keys, ("tab:orange", "tab:green", "tab:red", "tab:purple")):
    points = [(r["step"], r[key]) for r in records if key in r]
    ax.plot(*zip(*points), "o-", color=color, ms=4, label=key.replace("val_loss", "val").replace("_", " "))
  ax.set_xlabel("step")
  ax.set_ylabel("cross-entropy (nats/token)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = pathlib.Path(path)
  fig.savefig(path)
  plt.close(fig)
  return path


def _trailing_mean(values, window: int) -> list[float]:
  """Mean of each value and the window - 1 before it (fewer at the start)."""
  sums = [0.0]
  for v in values:
    sums.append(sums[-1] + v)
  return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(window, i + 1) for i in range(len(values))]
