"""`python -m s3r.experiments.snapshot RUN_DIR OUT.json`: record a finished run in results/.

Writes the run's final validation losses, its loss curve (every 10th step), throughput and
wall time, with the usual metadata (command, git revision, JAX version, machine, date), and
copies the loss plot beside it. `make train` calls it for the Quickstart run.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import numpy as np

from s3r.results import run_metadata
from s3r.train import report


def snapshot(run_dir: str, out: str, *, wall_s: float | None = None) -> dict:
  run = pathlib.Path(run_dir)
  records = report.read_metrics(run / report.METRICS_FILE)
  if not records:
    raise SystemExit(f"snapshot: no metrics in {run}")
  vals = [r for r in records if "val_loss" in r]
  last = vals[-1] if vals else {}
  steady = [r["step_time_s"] for r in records[len(records) // 10:]]  # skip the first 10% (warm-up)
  doc = {
      "meta": run_metadata(),
      "run": str(run),
      "config": json.loads((run / "config.json").read_text()),
      "steps": records[-1]["step"],
      "final_val_losses": {k: v for k, v in last.items() if k.startswith("val_loss")},
      "first_loss": records[0]["loss"], "final_loss": records[-1]["loss"],
      "median_step_s": float(np.median(steady)), "median_tokens_per_s": float(np.median(
          [r["tokens_per_s"] for r in records[len(records) // 10:]])),
      "wall_s": wall_s,
      "val_curve": [[r["step"], r["val_loss"]] for r in vals],
      "loss_curve": [[r["step"], r["loss"]] for r in records if r["step"] % 10 == 0 or r["step"] == 1],
  }
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  out_path.write_text(json.dumps(doc, indent=1) + "\n")
  if (run / report.PLOT_FILE).exists():
    shutil.copy(run / report.PLOT_FILE, out_path.with_suffix(".png"))
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
