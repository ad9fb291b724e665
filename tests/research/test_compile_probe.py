"""The compile probe's choice, its candidates per backend, its subprocess outcomes (ok, failed,
timed out) and its report, without JAX: the children are stand-ins. The whole probe runs on the
CPU in the device_quality dry run (tests/scripts/test_device_scripts.py)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from research import compile_probe as cp


def _ok(name: str, compile_s: float, step_s: float, backend: str = "gpu") -> dict:
  timings = {"compile_s": compile_s, "step_s": step_s, "lower_s": 1.0, "wall_s": compile_s + 2}
  return {"name": name, "status": "ok", "backend": backend, "attention": "xla", **timings}


def test_choose_takes_the_fastest_compile_whose_step_is_within_the_slack():
  default = _ok("default", 50.0, 0.010)
  results = [_ok("no_triton_gemm_autotune0", 5.0, 0.020), _ok("no_triton_gemm", 12.0, 0.014), default]
  assert cp.choose(results, slack=1.5) == "no_triton_gemm"  # autotune0's step is 2x the default's
  assert cp.choose(results, slack=2.0) == "no_triton_gemm_autotune0"
  assert cp.choose([_ok("no_triton_gemm", 60.0, 0.01), default], slack=1.5) == "default"


def test_choose_falls_back_when_candidates_fail():
  failed = {"name": "no_triton_gemm", "status": "failed"}
  timeout = {"name": "default", "status": "timeout"}
  assert cp.choose([failed, timeout], slack=1.5) == "default"  # nothing compiled: the default
  assert cp.choose([failed, _ok("default", 50.0, 0.01)], slack=1.5) == "default"
  # the default timed out: the fastest step among the others is the reference
  results = [_ok("no_triton_gemm_autotune0", 5.0, 0.030), _ok("no_triton_gemm", 12.0, 0.015), timeout]
  assert cp.choose(results, slack=1.5) == "no_triton_gemm"


def test_candidates_by_backend_cheapest_first_on_a_gpu():
  assert cp.candidate_names("", gpu=True) == ["no_triton_gemm_autotune0", "no_triton_gemm", "default"]
  assert cp.candidate_names("", gpu=False) == ["default"]
  assert cp.candidate_names("no_triton_gemm,default", gpu=False) == ["no_triton_gemm", "default"]
  with pytest.raises(ValueError, match="unknown candidates"):
    cp.candidate_names("fast", gpu=True)
  assert not cp.expects_gpu({"JAX_PLATFORMS": "cpu"})
  assert cp.with_base("no_triton_gemm", "--a=1") == "--a=1 --xla_gpu_enable_triton_gemm=false"
  assert cp.with_base("default", "") == ""


def test_run_candidate_reports_ok_failed_and_timeout():
  line = cp.RESULT_PREFIX + json.dumps({"compile_s": 1.0, "step_s": 0.1})
  ok = cp.run_candidate("default", [sys.executable, "-c", f"print({line!r})"], {}, timeout=30)
  assert ok["status"] == "ok" and ok["compile_s"] == 1.0 and ok["xla_flags"] == ""
  failed = cp.run_candidate("no_triton_gemm", [sys.executable, "-c", "raise SystemExit('no kernel')"], {}, timeout=30)
  assert failed["status"] == "failed" and "no kernel" in failed["error"]
  slow = cp.run_candidate("default", [sys.executable, "-c", "import time; time.sleep(30)"], {}, timeout=0.5)
  assert slow["status"] == "timeout" and slow["wall_s"] < 10


def _args(tmp_path, **kw) -> argparse.Namespace:
  args = cp.parser().parse_args(["--out", str(tmp_path), "--vocab", "512", "--budget", "100"])
  return argparse.Namespace(**{**vars(args), **kw})


def test_probe_skips_gpu_candidates_off_the_gpu_and_writes_the_choice(tmp_path, monkeypatch):
  monkeypatch.setattr(cp, "expects_gpu", lambda env: True)
  monkeypatch.setenv("XLA_FLAGS", "--base=1")
  ran = []

  def fake(name, argv, env, timeout):
    ran.append((name, argv[argv.index("--attention") + 1]))
    return _ok(name, 3.0, 0.01, "cpu") | {"xla_flags": cp.with_base(name, env["XLA_FLAGS"])}

  monkeypatch.setattr(cp, "run_candidate", fake)
  report = cp.probe(_args(tmp_path), log=lambda _: None)
  # the first candidate said cpu: the second GPU-only one is skipped, the default still runs
  assert ran == [("no_triton_gemm_autotune0", "auto"), ("default", "xla")]
  assert [c["status"] for c in report["candidates"]] == ["ok", "skipped", "ok"]
  assert report["chosen"] == "no_triton_gemm_autotune0"
  flags = "--base=1 --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0"
  assert (tmp_path / "xla_flags.txt").read_text() == flags + "\n"
  assert json.loads((tmp_path / "probe.json").read_text())["xla_flags"] == flags


def test_probe_skips_candidates_past_its_budget(tmp_path, monkeypatch):
  monkeypatch.setattr(cp, "expects_gpu", lambda env: False)
  monkeypatch.setattr(cp, "run_candidate", lambda *a: pytest.fail("ran past the budget"))
  report = cp.probe(_args(tmp_path, budget=1.0), log=lambda _: None)
  assert report["candidates"][0]["status"] == "skipped" and report["chosen"] == "default"
