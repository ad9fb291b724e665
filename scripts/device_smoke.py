"""`python scripts/device_smoke.py --out DIR`: the first minute of every device script.

Borrowed GPU time is scarce, so each device script first runs every code path it depends on at
the smallest size, in one process, and stops if any fails:
1. versions: Python, JAX, jaxlib, Flax, Optax, the backend and its devices;
2. lockstep: the `tiny` preset, 3 steps of two recipes on a random token folder, with the
   attention resolution (cuDNN where it compiles), the evaluation and the final gradient errors;
3. pallas: the Pallas grouped-GEMM check at a tiny MoE shape (compiled Triton kernels on a GPU,
   interpret mode elsewhere); a failure of its diagnostic families only (the tiled dW, which the
   GPU default does not run) is recorded under "diagnostic_failures" and does not stop the script;
4. step: one timed training step per recipe of `python -m benchmarks step` on the `tiny` preset.
Each stage's status, seconds and first error line go to DIR/smoke.json (rewritten after every
stage). The exit status is 0 when every stage passed, else 1 after a line starting "SMOKE FAILED".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time
import traceback

import numpy as np


def _versions(out: pathlib.Path) -> dict:
  import flax
  import jax
  import jaxlib
  import optax

  return {
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
  }


def _lockstep(out: pathlib.Path) -> dict:
  from research import lockstep

  tokens = out / "tokens"
  tokens.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  np.save(tokens / "train.npy", rng.integers(0, 512, 8_000).astype(np.uint16))
  np.save(tokens / "val.npy", rng.integers(0, 512, 1_000).astype(np.uint16))
  (tokens / "meta.json").write_text(json.dumps({"vocab_size": 512, "corpus": "random"}))
  cfg = lockstep.LockstepConfig(
    data=str(tokens),
    out=str(out / "lockstep"),
    preset="tiny",
    recipes=("int8_sr", "s3r_ec_dx"),
    steps=3,
    batch=2,
    seq=32,
    warmup=1,
    eval_every=2,
    eval_batches=1,
    fit_budget=True,
    time_budget=600.0,
    dose_keys=1,
  )
  summary = lockstep.run(cfg, log=lambda _: None)
  if not summary["complete"] or summary["dose"] is None or summary["steps_done"] != 3:
    raise RuntimeError(f"lockstep incomplete: {summary['steps_done']} steps, dose {summary['dose']}")
  return {"attention": summary["attention"], "val": {r: v[-1] for r, v in summary["curves"]["val"].items()}}


def _pallas(out: pathlib.Path) -> dict:
  from benchmarks import pallas_check

  code = pallas_check.main(["--shape", "64x8x2x48", "--tokens", "24", "--out-dir", str(out / "pallas")])
  report = json.loads((out / "pallas" / "pallas_check.json").read_text())
  if code not in (0, pallas_check.DIAGNOSTIC_EXIT):
    raise RuntimeError(
      f"the Pallas check failed in {', '.join(report['failed_families'])} (see pallas/pallas_check.json)"
    )
  return {"backend": report["backend"], "diagnostic_failures": report["failed_families"]}  # {} when all passed


def _step(out: pathlib.Path) -> dict:
  from benchmarks import cli

  argv = ["step", "--preset", "tiny", "--recipes", "bf16,s3r_ec_dx", "--batch", "2", "--seq", "32"]
  argv += ["--repeats", "1", "--warmup", "0", "--prime", "0", "--no-chart", "--out-dir", str(out / "step")]
  code = cli.main(argv)
  if code:
    raise RuntimeError(f"bench step exited {code}")
  return {"files": sorted(p.name for p in (out / "step").iterdir())}


STAGES = {"versions": _versions, "lockstep": _lockstep, "pallas": _pallas, "step": _step}


def run(out: str, stages: list[str] | None = None, log=print) -> dict:
  folder = pathlib.Path(out)
  folder.mkdir(parents=True, exist_ok=True)
  report = {"stages": {}, "passed": True}
  for name in stages or list(STAGES):
    t0 = time.monotonic()
    try:
      result, status = STAGES[name](folder), "passed"
    except Exception as e:  # every failure is reported; the script decides whether to go on
      result, status = {"error": f"{type(e).__name__}: {e}"[:2000]}, "failed"
      report["passed"] = False
      log(traceback.format_exc())
    report["stages"][name] = {"status": status, "seconds": round(time.monotonic() - t0, 2), "result": result}
    log(f"[smoke] {name}: {status} in {report['stages'][name]['seconds']:.1f}s")
    (folder / "smoke.json").write_text(json.dumps(report, indent=1, default=str))
  return report


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python scripts/device_smoke.py", description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="folder for smoke.json and the stages' files")
  p.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages (default %(default)s)")
  args = p.parse_args(argv)
  stages = [s for s in args.stages.split(",") if s]
  bad = [s for s in stages if s not in STAGES]
  if bad:
    p.error(f"unknown stages {bad}; valid: {', '.join(STAGES)}")
  report = run(args.out, stages)
  if not report["passed"]:
    failed = [n for n, s in report["stages"].items() if s["status"] == "failed"]
    print(f"SMOKE FAILED: {', '.join(failed)} (see {args.out}/smoke.json); nothing else was run", flush=True)
    return 1
  print(f"SMOKE PASSED: {', '.join(report['stages'])}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
