"""The families of `scripts/device_step.sh`, one after another within a time budget.

Reads PRESETS, BATCH, SEQ, REPEATS, WARMUP, WIDTH, VOCAB, RECIPES, COMPILE_THREADS and FIRST_S
from the environment (the script sets them). A family starts only if the time left exceeds its
estimate: FIRST_S for the first, then the time the previous family took, scaled by the ratio of
their parameters per layer times the sum of their depths. A family that does not start is
listed in skipped.json with its estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time


def _size(preset: str, depths: str) -> float:
  """Parameters per layer x the sum of the depths measured: the work of one family, up to a constant."""
  from s3r import model as s3r_model

  cfg = s3r_model.PRESETS[preset]
  per_layer = (s3r_model.param_count(cfg) - cfg.vocab_size * cfg.d_model) / cfg.n_layers
  return per_layer * sum(int(d) for d in depths.split(","))


def main(argv: list[str] | None = None) -> int:
  from benchmarks import cli

  p = argparse.ArgumentParser(prog="python scripts/device_step_families.py", description=__doc__.split("\n")[0])
  p.add_argument("--budget", type=float, required=True, help="seconds for all families")
  p.add_argument("--out-dir", required=True, help="where the bench_step_<preset>_* files go")
  args = p.parse_args(argv)
  env, start = os.environ, time.monotonic()
  estimate, skipped, previous = float(env.get("FIRST_S", "150")), [], None
  for item in env["PRESETS"].split():
    preset, _, depths = item.partition(":")
    if previous is not None:
      took, size = previous
      estimate = took * _size(preset, depths) / size
    left = args.budget - (time.monotonic() - start)
    if left < estimate:
      print(f"[families] {preset}: skipped, {left:.0f}s left, estimated {estimate:.0f}s", flush=True)
      skipped.append({"preset": preset, "depths": depths, "seconds_left": round(left), "estimate_s": round(estimate)})
      continue
    argv = ["step", "--preset", preset, "--layers", depths, "--batch", env["BATCH"], "--seq", env["SEQ"]]
    argv += ["--repeats", env["REPEATS"], "--warmup", env["WARMUP"], "--prime", "0", "--remat", "full"]
    argv += ["--attention", "auto", "--recipes", env["RECIPES"], "--compile-threads", env["COMPILE_THREADS"]]
    argv += ["--tag", preset, "--no-chart", "--out-dir", args.out_dir]
    argv += ["--width", env["WIDTH"]] if env.get("WIDTH") else []
    argv += ["--vocab", env["VOCAB"]] if env.get("VOCAB") else []
    sys.argv = ["python -m benchmarks", *argv]  # what the results files record as their command
    print(" ".join(sys.argv), flush=True)
    t0 = time.monotonic()
    cli.main(argv)
    previous = (time.monotonic() - t0, _size(preset, depths))
  pathlib.Path(args.out_dir, "skipped.json").write_text(json.dumps(skipped, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
