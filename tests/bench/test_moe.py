"""`python -m benchmarks moe` end to end at a tiny shape (1 repeat); numbers are not checked, only structure,
and the dense capacity formulation of the GEMM comparison equals the grouped GEMMs."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from benchmarks import cli, moe, options
from labtools import paper


@pytest.mark.slow
def test_moe_bench_writes_block_and_gemm_results(tmp_path):
  args = cli.build_parser().parse_args(
    [
      "moe",
      "--shapes",
      "32x4x2x16+1",
      "--tokens",
      "16",
      "--repeats",
      "1",
      "--warmup",
      "0",
      "--prime",
      "0",
      "--out-dir",
      str(tmp_path),
      "--tag",
      "tiny",
    ]
  )
  assert args.func(args) == 0
  stem = tmp_path / f"bench_moe_block_tiny_{jax.default_backend()}"
  doc = json.loads(stem.with_suffix(".json").read_text())
  assert doc["complete"] is True
  (block,) = doc["results"]["block"]
  assert (block["hidden"], block["experts"], block["top_k"], block["shared"], block["rows"]) == (32, 4, 2, 1, 32)
  assert list(block["recipes"]) == list(options.BENCH_RECIPES)
  assert block["recipes"]["bf16"]["speedup_vs_bf16"] == 1.0
  assert all(np.isfinite(r["speedup_vs_int8_sr"]) for r in block["recipes"].values())
  (gemm,) = doc["results"]["gemm"]
  assert list(gemm["forms"]) == list(moe.GEMM_FORMS) and gemm["rows"] == 32
  assert gemm["forms"]["ragged"]["speedup_vs_ragged"] == 1.0
  md = stem.with_suffix(".md").read_text()
  assert "speedup vs int8_sr" in md and "speedup vs ragged_dot" in md
  assert "## Targets" in md and "too few rounds" in md  # one round gives no interval
  assert block["recipes"]["s3r"]["time_vs_int8_rtne_paired_ci95"] is None
  assert stem.with_suffix(".png").stat().st_size > 0


def test_gemm_formulations_give_identical_int32_results():
  shape = {"hidden": 24, "experts": 3, "top_k": 2, "expert_width": 16, "shared": 0}
  configs = moe.gemm_configs(shape, list(moe.ALL_GEMM_FORMS), rows=30)
  outs = {f: fn(*args) for f, (fn, args) in configs.items()}
  for f in ("tiled", "dense", "pallas"):
    for a, b in zip(outs[f], outs["ragged"]):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_paper_moe_shapes_parse_by_name_and_custom_spec():
  shapes = moe.parse_shapes("qwen3-30b-a3b,64x8x2x32+2")
  assert shapes["qwen3-30b-a3b"] == paper.MOE_SHAPES["qwen3-30b-a3b"]
  assert shapes["qwen3-30b-a3b"]["experts"] == 128 and paper.MOE_SHAPES["deepseek-v2-lite"]["shared"] == 2
  assert shapes["64x8x2x32+2"] == {"hidden": 64, "experts": 8, "top_k": 2, "expert_width": 32, "shared": 2}


def test_a_formulation_that_fails_to_compile_is_recorded_and_left_out():
  shape = {"hidden": 24, "experts": 3, "top_k": 2, "expert_width": 16, "shared": 0}
  configs = moe.gemm_configs(shape, ["tiled", "ragged"], rows=30)
  fn, args = configs["ragged"]
  configs["ragged"] = (fn, args[:2])  # a call with missing operands does not lower
  errors = []
  ok = moe._compiled(configs, "tiny", errors)
  assert list(ok) == ["tiled"] and [e["formulation"] for e in errors] == ["ragged"]
  np.testing.assert_array_equal(np.asarray(ok["tiled"][0](*ok["tiled"][1])[0]), np.asarray(fn(*args)[0]))


@pytest.mark.parametrize(
  "ci, bound, kind, verdict",
  [
    ((0.98, 1.04), 1.05, "at most", "met"),
    ((1.00, 1.08), 1.05, "at most", "not resolved"),
    ((1.06, 1.10), 1.05, "at most", "missed"),
    ((1.21, 1.30), 1.2, "at least", "met"),
    ((1.10, 1.25), 1.2, "at least", "not resolved"),
    ((0.90, 1.10), 1.2, "at least", "missed"),
    (None, 1.2, "at least", "too few rounds"),
  ],
)
def test_a_target_is_met_or_missed_only_when_the_whole_interval_is_on_one_side(ci, bound, kind, verdict):
  assert moe.target_verdict(ci, bound, kind) == verdict


def test_the_chart_is_relative_to_bf16_else_int8_sr_else_left_out():
  assert moe.chart_reference(["int8_sr", "bf16", "s3r"]) == "bf16"
  assert moe.chart_reference(["int8_rtne", "int8_sr", "s3r"]) == "int8_sr"
  assert moe.chart_reference(["int8_rtne", "s3r"]) is None
