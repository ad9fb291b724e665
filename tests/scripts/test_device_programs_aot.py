"""The programs the device scripts run, compiled for the H100 target on this CPU (`python -m benchmarks aot`,
no GPU): a program that XLA:GPU would refuse fails here before a borrowed GPU minute is spent on it.

Each case is one script's programs at that script's sizes. Train steps are compiled at one layer (every
block of a preset is the same program, so a deeper step repeats it; the compile time of the full depth is
what `results/aot/` records). Slow tests, skipped with the reason where the `gpu-aot` extra is missing:
`pytest -m "slow or not slow" tests/scripts/test_device_programs_aot.py` in an environment with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import aot
from tests.faults.conftest import REPO

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(
    not aot.cuda_plugin_installed(),
    reason="JAX's CUDA plugin is not installed (pip install -e '.[gpu-aot]' -c constraints.txt)",
  ),
]

STEP = ["--program", "step", "--layers", "1", "--batch", "4", "--seq", "4096", "--recipes", "bf16,s3r_ec_dx"]
CASES = {
  # device_quality.sh: the lockstep runner's train step of paper-12l, 8 x 2048, its three recipes
  "quality": ["--program", "lockstep", "--preset", "paper-12l", "--layers", "1", "--batch", "8", "--seq", "2048",
              "--recipes", "int8_sr,s3r,s3r_ec_dx"],
  # device_step.sh: the dense families at 4 x 4096 (the script's batch and sequence)
  "step_llama": [*STEP, "--preset", "llama3.1-8b"],
  "step_qwen": [*STEP, "--preset", "qwen3-8b"],
  "step_gemma": [*STEP, "--preset", "gemma3-12b"],  # head dim 256: cuDNN refuses, XLA's attention (as the script)
  # device_moe.sh: one grouped GEMM of each MoE shape at its rows (4096 tokens x top-k), the Pallas kernels
  "moe_qwen": ["--program", "moe", "--moe-shape", "2048x768x128", "--moe-tokens", "32768", "--moe-impl", "auto",
               "--recipes", "bf16,s3r_ec_dx"],
  "moe_deepseek": ["--program", "moe", "--moe-shape", "2048x1408x64", "--moe-tokens", "24576", "--moe-impl", "auto",
                   "--recipes", "bf16,s3r_ec_dx"],
  # device_bench.sh: the FFN block at T = 16384, smallest and largest shape it reaches in one call
  "bench_ffn": ["--program", "ffn", "--shapes", "W1,W6", "--tokens", "16384", "--recipes", "bf16,int8_sr,s3r_ec_dx"],
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_the_device_scripts_programs_compile_for_the_h100(case, tmp_path):
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-m", "benchmarks", "aot", "--target", "h100", "--out-dir", str(tmp_path), *CASES[case]]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (path,) = tmp_path.glob("bench_aot_h100*_cpu.json")
  rows = json.loads(path.read_text())["results"]
  failed = {r["recipe"]: r["error"] for r in rows if "error" in r}
  assert not failed, failed
  for r in rows:  # every program fits the H100's 80 GB with its arguments, outputs and temporaries
    m = r["memory"]
    assert m["argument"] + m["output"] - m["alias"] + m["temp"] < 80 * 2**30, (r["recipe"], m)


def test_the_calibration_programs_compile_for_the_h100(tmp_path):
  """device_calibrate.sh: the FFN block at W9 (T = 16384) and the 2-layer train step of paper-12l (8 x 2048), every
  default recipe (`bf16_f32bwd` FFN only), through `calibrate run --target h100`, the script's own code path."""
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-m", "benchmarks", "calibrate", "run", "--target", "h100", "--programs", "ffn_W9,step"]
  proc = subprocess.run(
    [*cmd, "--out-dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO, env=env, timeout=3600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(p.read_text()) for p in tmp_path.glob("programs/*/*.json") if p.name != "skipped.json"]
  assert len(rows) == 5 + 4
  failed = {(r["program"], r["recipe"]): r["error"] for r in rows if "error" in r}
  assert not failed, failed
  for r in rows:
    m = r["memory"]
    assert m["argument"] + m["output"] - m["alias"] + m["temp"] < 80 * 2**30, (r["program"], r["recipe"], m)
    assert (tmp_path / "programs" / r["program"] / f"{r['recipe']}.hlo.txt").exists()
  (old,) = [r for r in rows if r["recipe"] == "bf16_f32bwd"]  # the emulated bf16 whose backward GEMMs are f32
  assert sum(n for kind, n in old["gemm_census"].items() if kind.startswith("triton f32 x f32")) == 6
