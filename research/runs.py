"""Everything that reads what `s3r train` wrote: metrics and config, run summaries, the latest checkpoint.

A run directory holds `metrics.jsonl` (one record per logged step; evaluation steps add
`val_loss` and `val_loss_<set>`), `config.json` and `checkpoints/`. `read_run` is the one reader
of metrics and config: `summarize_run` (the sweep's per-run summary) and `snapshot` build on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, overload

import numpy as np

from labtools.results import repo_relative
from s3r.train.run import report

CURVE_EVERY = 5  # keep every 5th step of the training-loss curve in a sweep summary


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """The metrics and config of one run directory."""

  path: pathlib.Path  # the run directory
  records: list[dict]  # metrics.jsonl, one record per logged step
  config: dict  # config.json ({} if absent)

  @property
  def evals(self) -> list[dict]:
    """The records of evaluation steps."""
    return [r for r in self.records if "val_loss" in r]

  @property
  def final_val_losses(self) -> dict[str, float]:
    """`val_loss*` of the last evaluation, keyed as in the metrics."""
    last = self.evals[-1] if self.evals else {}
    return {k: v for k, v in last.items() if k.startswith("val_loss")}

  @property
  def val_curve(self) -> list[list[float]]:
    return [[r["step"], r["val_loss"]] for r in self.evals]

  def loss_curve(self, every: int) -> list[list[float]]:
    """[step, training loss] at step 1 and every `every` steps."""
    return [[r["step"], r["loss"]] for r in self.records if r["step"] % every == 0 or r["step"] == 1]


def read_run(run_dir: str | pathlib.Path) -> RunRecord:
  """Metrics and config of a run directory (empty where a file is absent)."""
  run = pathlib.Path(run_dir)
  config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
  return RunRecord(run, report.read_metrics(run / report.METRICS_FILE), config)


def summarize_run(out: pathlib.Path, *, recipe: str, lr: float, seed: int, status: str, wall_s: float) -> dict:
  """A small JSON-able record of one finished sweep run (what the tables and the figure need)."""
  run = read_run(out)
  records = run.records
  val_losses = {("val" if k == "val_loss" else k.removeprefix("val_loss_")): v for k, v in run.final_val_losses.items()}
  step_times = [r["step_time_s"] for r in records if r["step"] > 1 and "step_time_s" in r]  # step 1 compiles
  return {
    "run": run.path.name, "recipe": recipe, "lr": lr, "seed": seed, "status": status, "wall_s": wall_s,
    "steps": records[-1]["step"] if records else 0, "val_losses": val_losses if status == "done" else {},
    "median_step_s": float(np.median(step_times)) if step_times else None,
    "param_count": run.config.get("param_count"), "train_config": portable(run.config.get("train")),
    "curve": run.loss_curve(CURVE_EVERY), "val_curve": run.val_curve,
  }  # fmt: skip


@overload
def portable(train: dict) -> dict: ...
@overload
def portable(train: None) -> None: ...
def portable(train: dict | None) -> dict | None:
  """A run's training config as a results file records it: paths (out, data, cache) without
  machine-specific prefixes (the run stores them absolute so that `s3r eval` finds them)."""
  return None if train is None else {k: repo_relative(v) if isinstance(v, str) else v for k, v in train.items()}


def load_summaries(cfg) -> dict[str, dict]:
  """Finished runs of a sweep (`protocol.SweepConfig`), by run name."""
  out = {}
  if cfg.summary_dir.is_dir():
    for path in sorted(cfg.summary_dir.glob("*.json")):
      out[path.stem] = json.loads(path.read_text())
  return out


def _adam_nu(opt_state):
  """The second-moment tree `nu` inside an optax state (ScaleByAdamState)."""
  found = []

  def visit(node):
    if hasattr(node, "nu") and hasattr(node, "mu"):
      found.append(node.nu)
    elif isinstance(node, (tuple, list)):
      for child in node:
        visit(child)

  visit(opt_state)
  if len(found) != 1:
    raise ValueError(f"expected one Adam state in the optimizer state, found {len(found)}")
  return found[0]


def load_run(path: str, *, log=print, batch: int | None = None, step: int | None = None) -> dict:
  """The checkpoint of `step` (default: the latest) of a run: model config, params, Adam's ν, the init
  params of the same seed, the step and the first validation batch (host numpy) of `batch` sequences
  (default: the run's batch)."""
  from s3r import data as s3r_data
  from s3r.train.loop import build, make_mesh, open_run, prepare_data

  ckpt, cfg, _ = open_run(path, step=step)
  corpus = prepare_data(cfg, log)
  setup = build(cfg, corpus.tokenizer.vocab_size, make_mesh(dataclasses.replace(cfg, mesh=None)))
  state, _ = ckpt.restore(setup.abstract_state, step)
  ckpt.close()
  val_batch = next(
    s3r_data.eval_batches(corpus.val_tokens["val"], batch_size=batch or cfg.batch, seq_len=cfg.seq_len, max_batches=1)
  )
  init = setup.init_state(setup.keys["init"])
  return {"train_config": cfg, "model_cfg": setup.model_cfg, "params": state.params,
          "nu": _adam_nu(state.opt_state), "init_params": init.params, "step": int(state.step),
          "val_batch": np.asarray(val_batch)}  # fmt: skip


def lists_as_tuples(values: dict[str, Any]) -> dict[str, Any]:
  """`values` with its lists (as JSON gives them) made tuples, the configs' sequence type."""
  return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def pid_alive(pid: int) -> bool:
  """Whether a process `pid` (from a sweep's lock file) still runs."""
  try:
    os.kill(pid, 0)
  except (OSError, ValueError):
    return False
  return pid > 0
