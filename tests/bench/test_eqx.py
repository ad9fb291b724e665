"""`python -m benchmarks eqx` at the tiniest size: every configuration runs, the two ways into s3r
compute the same loss, and the results files say what was measured."""

import json

import pytest

pytest.importorskip("equinox")

from benchmarks import cli  # noqa: E402


def test_eqx_bench_runs_both_paths_and_they_compute_the_same_forward(tmp_path):
  args = cli.build_parser().parse_args(
    ["eqx", "--recipes", "bf16,int8_rtne", "--batch", "2", "--seq", "8", "--dim", "16", "--heads", "2"]
    + ["--layers", "1", "--vocab", "32", "--repeats", "2", "--warmup", "0", "--out-dir", str(tmp_path)]
  )
  results = cli.importlib.import_module("benchmarks.eqx").run(args)
  assert set(results) == {"eqx", *(f"{r} {p}" for r in ("bf16", "int8_rtne") for p in ("quantize_fn", "qmatmul+vmap"))}
  for recipe in ("bf16", "int8_rtne"):
    a, b = results[f"{recipe} quantize_fn"], results[f"{recipe} qmatmul+vmap"]
    # the same INT8 (or bf16) forward of the same weights on the same tokens: the keys play no part in it
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert b["vs_quantize_fn"] > 0 and len(b["samples_s"]) == 2
  assert results["int8_rtne quantize_fn"]["loss"] != pytest.approx(results["eqx"]["loss"], rel=1e-6)
  doc = json.loads(next(tmp_path.glob("bench_eqx_*.json")).read_text())
  assert doc["complete"] and doc["settings"]["layers"] == 1 and doc["meta"]["git"]
  assert "qmatmul+vmap / quantize_fn" in next(tmp_path.glob("bench_eqx_*.md")).read_text()
