"""`python -m research.snapshot RUN_DIR OUT.json`: record a finished run as a results file
(the quickstart's: research/results/quickstart.json).

Writes the run's final validation losses, its loss curve (every 10th step), throughput and
wall time, with the usual metadata (command, git revision, JAX version, machine, date), and
copies the loss plot beside it. `make train` calls it for the Quickstart run.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np

from labtools.results import repo_relative, run_metadata, write_json
from research.runs import portable, read_run
from s3r.train.run import report


def snapshot(run_dir: str, out: str, *, wall_s: float | None = None) -> dict:
  run = read_run(run_dir)
  records = run.records
  if not records:
    raise SystemExit(f"snapshot: no metrics in {run.path}")
  timed = [r for r in records if "step_time_s" in r]  # the step-0 line has losses only
  steady = timed[len(timed) // 10 :]  # skip the first 10% (warm-up)
  doc = {
    "meta": run_metadata(),
    "run": repo_relative(str(run.path)),
    "config": {**run.config, "train": portable(run.config.get("train"))},
    "steps": records[-1]["step"],
    "final_val_losses": run.final_val_losses,
    "first_loss": records[0]["loss"],
    "final_loss": records[-1]["loss"],
    "median_step_s": float(np.median([r["step_time_s"] for r in steady])),
    "median_tokens_per_s": float(np.median([r["tokens_per_s"] for r in steady])),
    "wall_s": wall_s,
    "val_curve": run.val_curve,
    "loss_curve": run.loss_curve(10),
  }
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  write_json(out_path, doc)
  if (run.path / report.PLOT_FILE).exists():
    shutil.copy(run.path / report.PLOT_FILE, out_path.with_suffix(".png"))
  return doc


def main(argv: list[str]) -> int:
  if len(argv) not in (2, 3):
    print(__doc__.splitlines()[0], file=sys.stderr)
    return 2
  doc = snapshot(argv[0], argv[1], wall_s=float(argv[2]) if len(argv) == 3 else None)
  print(f"snapshot: {argv[1]}: final {doc['final_val_losses']}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
