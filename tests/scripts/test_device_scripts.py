"""Dry runs of the device scripts on the CPU, at the tiniest sizes, with the environment they set:
a change that would break a script on a borrowed GPU fails here first. Each script must exit 0
and bring back exactly its archive and its log, with the files its README entry promises.

The dry runs of `device_quality.sh` (smoke stage, compile probe, lockstep with a fitted schedule,
the dose, packing), `device_step.sh`, `device_bench.sh` and `device_moe.sh` take 15-80 s each, so
they are slow tests: run `pytest -m "slow or not slow" tests/scripts` before borrowing a GPU. The
default suite keeps the fast ones (the failing-smoke stop, the unpacking)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICK_SMOKE = {"SMOKE_STAGES": "versions"}  # the full smoke stage has its own (slow) test below


def _run(script: str, out: pathlib.Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
  work = out.parent / f"work_{out.name}"  # the script's work folder, outside OUT as on the device
  full = {**os.environ, "PY": sys.executable, "OUT": str(out), "WORK": str(work), "JAX_PLATFORMS": "cpu", **env}
  return subprocess.run(
    ["bash", f"scripts/{script}.sh"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout
  )


def _brought_back(out: pathlib.Path, name: str) -> set[str]:
  """The archive's member files (and a check that only the archive and the log came back)."""
  assert sorted(p.name for p in out.iterdir()) == [f"{name}.log", f"{name}.tar.gz"]
  with tarfile.open(out / f"{name}.tar.gz") as tar:
    return {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}


@pytest.fixture()
def tokens(tmp_path):
  folder = tmp_path / "tokens"
  folder.mkdir()
  rng = np.random.default_rng(0)
  np.save(folder / "train.npy", rng.integers(0, 512, 6_000).astype(np.uint16))
  np.save(folder / "val.npy", rng.integers(0, 512, 600).astype(np.uint16))
  (folder / "meta.json").write_text(json.dumps({"vocab_size": 512, "corpus": "random"}))
  return folder


@pytest.mark.slow  # its three working stages are the entry points the dry runs below run at the same sizes
def test_the_smoke_stage_runs_every_stage_and_reports_each(tmp_path):
  result = subprocess.run(
    [sys.executable, "scripts/device_smoke.py", "--out", str(tmp_path)],
    cwd=ROOT,
    env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  report = json.loads((tmp_path / "smoke.json").read_text())
  assert report["passed"] and list(report["stages"]) == ["versions", "lockstep", "pallas", "step"]
  assert "SMOKE PASSED" in result.stdout


def test_a_failing_smoke_stage_stops_the_script(tmp_path, tokens):
  result = _run("device_quality", tmp_path / "out", {**QUICK_SMOKE, "TOKENS": str(tokens), "SMOKE_STAGES": "nope"})
  assert result.returncode == 1
  assert "SMOKE STAGE FAILED" in result.stdout and "lockstep budget" not in result.stdout


@pytest.mark.slow
def test_device_quality_dry_run(tmp_path, tokens):
  env = {"PRESET": "tiny", "BATCH": "2", "SEQ": "32", "STEPS": "4", "WARMUP": "1", "EVAL_EVERY": "2"}
  env |= {"EVAL_BATCHES": "1", "DOSE_KEYS": "1", "TOKENS": str(tokens), "TOTAL_S": "900", **QUICK_SMOKE}
  env["PROBE"] = "always"  # the suite sets XLA_FLAGS, which would skip the probe
  env["PRECOMPILED"] = "none"  # programs a developer saved for a GPU call in .cache/ would skip it too
  # the probe at tiny's full depth compiles the run's own s3r_ec_dx step: the run then reads it
  # from the suite's compilation cache, so the probe adds little to this test
  env["PROBE_LAYERS"] = "2"
  result = _run("device_quality", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  files = _brought_back(tmp_path / "out", "device_quality")
  assert {"run/summary.json", "run/summary.md", "run/curves.jsonl", "smoke/smoke.json", "probe/probe.json"} <= files
  with tarfile.open(tmp_path / "out" / "device_quality.tar.gz") as tar:
    summary_file, probe_file = tar.extractfile("./run/summary.json"), tar.extractfile("./probe/probe.json")
    assert summary_file is not None and probe_file is not None
    summary, probe = json.load(summary_file), json.load(probe_file)
  assert summary["complete"] and summary["schedule"]["fitted"] and summary["dose"]
  assert set(summary["compile_s_by_recipe"]) == {"int8_sr", "s3r", "s3r_ec_dx"}
  assert probe["settings"]["layers"] == 2 and probe["settings"]["schedule_steps"] == 4
  # PROBE=always: the suite's XLA_FLAGS are the base; off the GPU only the default (the base alone) runs
  assert [c["name"] for c in probe["candidates"]] == ["default"] and probe["candidates"][0]["status"] == "ok"
  assert probe["chosen"] == "default" and summary["xla_flags"] == probe["xla_flags"] == os.environ.get("XLA_FLAGS", "")
  assert "compile probe exit 0" in result.stdout


@pytest.mark.slow
def test_device_step_dry_run_keeps_every_family_it_starts(tmp_path):
  env = {"PRESETS": "llama3.1-8b:1 gemma3-12b:1", "RECIPES": "bf16,s3r_ec_dx", "WIDTH": "64", "VOCAB": "512"}
  env |= {"BATCH": "2", "SEQ": "32", "REPEATS": "1", "WARMUP": "0", "TOTAL_S": "900", "FIRST_S": "1", **QUICK_SMOKE}
  env |= {"CUBLAS_PRESETS": "llama3.1-8b:1", "CUBLAS_MIN_S": "1"}  # the second pass, GEMMs off Triton (a GPU flag)
  result = _run("device_step", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  files = _brought_back(tmp_path / "out", "device_step")
  assert {"bench_step_llama3.1-8b_cpu.json", "bench_step_gemma3-12b_cpu.json", "skipped.json"} <= files
  assert "cublas/bench_step_llama3.1-8b_cpu.json" in files and "cublas bench exit 0" in result.stdout


@pytest.mark.slow
def test_device_bench_dry_run(tmp_path):
  env = {"SHAPES": "W1", "FFN_TOKENS": "64", "Q_TOKENS": "64", "MEM_SHAPES": "W1", "MEM_TOKENS": "64", **QUICK_SMOKE}
  result = _run("device_bench", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  for part in ("static memory", "ffn", "quantizer"):
    assert f"{part} exit 0" in result.stdout, part
  files = _brought_back(tmp_path / "out", "device_bench")
  assert {"bench_ffn_cpu.json", "bench_quantizer_cpu.json", "static_memory/bench_static_cpu.json"} <= files


@pytest.mark.slow
def test_device_moe_dry_run(tmp_path):
  env = {"TOKENS": "16", "GEMM_TOKENS": "16", "CHECK_TOKENS": "16", "SHAPE_Q": "32x8x2x16", "SHAPE_D": "32x4x2x24+1"}
  env |= {"REPEATS": "1", "NUMBER": "1", "RECIPES": "s3r_ec_dx", "CHECK_S": "600", "GEMM_S": "600"}
  env |= {"BLOCK_S": "600", **QUICK_SMOKE}
  result = _run("device_moe", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  files = _brought_back(tmp_path / "out", "device_moe")
  assert {
    "pallas_check/pallas_check.json",
    "gemm_qwen/bench_moe_cpu.json",
    "block_deepseek/bench_moe_block_cpu.json",
  } <= files


def test_device_unpack_puts_archives_under_results_gpu_never_overwrites_and_takes_a_suffix(tmp_path):
  src = tmp_path / "back"
  (src / "w").mkdir(parents=True)
  (src / "w" / "summary.json").write_text("{}")
  subprocess.run(["tar", "czf", str(src / "device_quality.tar.gz"), "-C", str(src / "w"), "."], check=True)
  (src / "device_quality.log").write_text("log")
  repo = tmp_path / "repo"
  (repo / "scripts").mkdir(parents=True)
  (repo / "scripts" / "device_unpack.sh").write_text((ROOT / "scripts" / "device_unpack.sh").read_text())
  run = lambda *suffix: subprocess.run(
    ["bash", "scripts/device_unpack.sh", str(src), *suffix], cwd=repo, capture_output=True, text=True
  )
  first = run()
  assert first.returncode == 0, first.stderr
  assert sorted(p.name for p in (repo / "research/results/device_quality").iterdir()) == [
    "device_quality.log",
    "summary.json",
  ]
  again = run()
  assert again.returncode == 2 and "give a SUFFIX" in again.stderr
  beside = run("-2")  # a second run of the script goes beside the first
  assert beside.returncode == 0, beside.stderr
  assert (repo / "research/results/device_quality-2/summary.json").exists()
  assert run("/x").returncode == 2 and (repo / "research/results/device_quality/summary.json").exists()


@pytest.mark.slow
def test_device_quality_loads_the_programs_compiled_ahead_and_skips_the_probe(tmp_path, tokens):
  from tests.research.conftest import precompile_lockstep_here

  precompile_lockstep_here(tmp_path / "programs", ("int8_sr", "s3r", "s3r_ec_dx"), seq=32, steps=4)
  env = {"PRESET": "tiny", "BATCH": "2", "SEQ": "32", "STEPS": "4", "WARMUP": "1", "EVAL_EVERY": "2"}
  env |= {"EVAL_BATCHES": "1", "DOSE_KEYS": "1", "TOKENS": str(tokens), "TOTAL_S": "900", **QUICK_SMOKE}
  env |= {"PROBE": "always", "PRECOMPILED": str(tmp_path / "programs")}
  result = _run("device_quality", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  assert "compile probe skipped" in result.stdout and result.stdout.count("loaded the program compiled ahead") == 3
  with tarfile.open(tmp_path / "out" / "device_quality.tar.gz") as tar:
    summary_file = tar.extractfile("./run/summary.json")
    assert summary_file is not None
    summary = json.load(summary_file)
  recipes = {"int8_sr", "s3r", "s3r_ec_dx"}
  if "no summary from the run with the programs compiled ahead" in result.stdout:
    # XLA:CPU has failed to run a deserialized program here ("Function <fusion> not found") when this test
    # ran after other tests, never in a process of its own; the cause (in the CPU runtime) is not known.
    # Then the script's second run, compiling everything, must have finished the job
    assert re.search(r"NOT_FOUND: Function \S+ not found", result.stdout), result.stdout[-6000:]
    assert summary["complete"] and set(summary["compile_s_by_recipe"]) == recipes and not summary["loaded_s_by_recipe"]
  else:
    assert summary["complete"] and set(summary["loaded_s_by_recipe"]) == recipes and not summary["compile_s_by_recipe"]


CALIBRATE_TINY = {
  "TOKENS": "64", "STEP_PRESET": "tiny", "STEP_LAYERS": "1", "STEP_BATCH": "2", "STEP_SEQ": "32", "ITERS": "1",
  "REPEATS": "1", "NUMBER": "1", "SWEEP_SHAPES": "64x128", "SWEEP_TOKENS": "64", "SWEEP_DTYPES": "s8,bf16",
  "SWEEP_REPEATS": "1", "SWEEP_NUMBER": "1", "FIRST_PROGRAMS": "ffn_64x128", "TOTAL_S": "900", "FIRST_S": "300",
  "SWEEP_S": "300", "CUBLAS_S": "100", "CUBLAS_MIN_S": "1", "REVISION": "abc1234", **QUICK_SMOKE,
}  # fmt: skip


@pytest.mark.slow
def test_device_calibrate_dry_run_writes_the_calibration_file(tmp_path):
  env = {
    **CALIBRATE_TINY,
    "FIRST_RECIPES": "int8_rtne",
    "PROGRAMS": "ffn_64x128,step",
    "RECIPES": "int8_rtne,bf16_f32bwd",
  }
  result = _run("device_calibrate", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  for part in ("programs first pass", "GEMM sweep", "programs second pass", "cublas sweep", "collect"):
    assert f"{part} exit 0" in result.stdout, part
  files = _brought_back(tmp_path / "out", "device_calibrate")
  assert {
    "calibration.json",
    "meta.json",
    "programs/ffn_64x128/int8_rtne.json",
    "programs/ffn_64x128/int8_rtne.hlo.txt",
    "programs/ffn_64x128/bf16_f32bwd.json",
    "programs/step_tiny_1l/int8_rtne.json",
    "gemms/bench_gemm_sweep_cpu.json",
    "gemms/bench_gemm_sweep_cublas_s8_cpu.json",
  } <= files
  assert "programs/step_tiny_1l/bf16_f32bwd.json" not in files  # the emulated old bf16 is an FFN block only
  assert "ffn_64x128 int8_rtne: measured already" in result.stdout  # the second pass goes on from the first
  with tarfile.open(tmp_path / "out" / "device_calibrate.tar.gz") as tar:
    member = tar.extractfile("./calibration.json")
    assert member is not None
    found = json.load(member)
  assert found["revision"] == "abc1234" and found["device_kind"] == "cpu"
  programs = {(p["program"], p["recipe"]) for p in found["programs"]}
  assert programs == {("ffn_64x128", "int8_rtne"), ("ffn_64x128", "bf16_f32bwd"), ("step_tiny_1l", "int8_rtne")}
  assert all(p["step_seconds"] > 0 and p["kernels"] for p in found["programs"])
  assert len(found["gemms"]) == 3 * 2 + 3  # s8 and bf16 at the default flags, s8 again with Triton GEMMs off


@pytest.mark.slow
def test_device_calibrate_keeps_going_when_a_part_fails(tmp_path):
  env = {**CALIBRATE_TINY, "FIRST_RECIPES": "no_such_recipe", "PROGRAMS": "ffn_64x128", "RECIPES": "no_such_recipe"}
  env |= {"SWEEP_DTYPES": "s8", "CUBLAS_MIN_S": "100000"}
  result = _run("device_calibrate", tmp_path / "out", env)
  assert result.returncode == 0, result.stdout[-4000:]
  assert "programs first pass exit 1" in result.stdout and "GEMM sweep exit 0" in result.stdout
  assert "with Triton GEMMs off skipped" in result.stdout and "collect exit 0" in result.stdout
  files = _brought_back(tmp_path / "out", "device_calibrate")
  assert {"calibration.json", "gemms/bench_gemm_sweep_cpu.json"} <= files
