"""The performance model (`python -m benchmarks perfmodel`): what it reads from HLO, its time rule, its fit, and that
the committed validation and prediction files are what the committed kernels and measurements give."""

from __future__ import annotations

import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import perfmodel as pm
from benchmarks import perfmodel_hlo, perfmodel_validate
from benchmarks.perfmodel_hlo import Kernel

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "perfmodel"

# A GPU module in the shape XLA:GPU prints it: one Triton GEMM (bf16 operands, a [8, 32] x [32, 16] dot) in a loop
# of 3 trips whose body slices one layer out of a [3, 32, 16] weight stack, and one elementwise fusion.
GPU_HLO = """HloModule m

%gemm_computation (p0: bf16[8,32], p1: bf16[32,16]) -> bf16[8,16] {
  %p0 = bf16[8,32]{1,0} parameter(0)
  %p1 = bf16[32,16]{1,0} parameter(1)
  %dot.1 = f32[8,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %c = bf16[8,16]{1,0} convert(%dot.1)
}

%slice_computation (s0: bf16[3,32,16], s1: s32[]) -> bf16[32,16] {
  %s0 = bf16[3,32,16]{2,1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = bf16[1,32,16]{2,1,0} dynamic-slice(%s0, %s1, %zero, %zero), dynamic_slice_sizes={1,32,16}
  ROOT %b = bf16[32,16]{1,0} bitcast(%ds)
}

%act_computation (a0: bf16[8,16]) -> bf16[8,16] {
  %a0 = bf16[8,16]{1,0} parameter(0)
  %t = bf16[8,16]{1,0} tanh(%a0)
  ROOT %m = bf16[8,16]{1,0} multiply(%t, %t)
}

%body (arg: (s32[], bf16[8,32], bf16[3,32,16])) -> (s32[], bf16[8,32], bf16[3,32,16]) {
  %arg = (s32[], bf16[8,32]{1,0}, bf16[3,32,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = bf16[8,32]{1,0} get-tuple-element(%arg), index=1
  %w = bf16[3,32,16]{2,1,0} get-tuple-element(%arg), index=2
  %layer = bf16[32,16]{1,0} fusion(%w, %i), kind=kLoop, calls=%slice_computation
  %y = bf16[8,16]{1,0} fusion(%x, %layer), kind=kCustom, calls=%gemm_computation, TRITON
  %z = bf16[8,16]{1,0} fusion(%y), kind=kLoop, calls=%act_computation
  ROOT %out = (s32[], bf16[8,32]{1,0}, bf16[3,32,16]{2,1,0}) tuple(%i, %x, %w)
}

%cond (carg: (s32[], bf16[8,32], bf16[3,32,16])) -> pred[] {
  %carg = (s32[], bf16[8,32]{1,0}, bf16[3,32,16]{2,1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%carg), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%ci, %three), direction=LT
}

ENTRY %main (x0: bf16[8,32], w0: bf16[3,32,16]) -> bf16[8,32] {
  %x0 = bf16[8,32]{1,0} parameter(0)
  %w0 = bf16[3,32,16]{2,1,0} parameter(1)
  %zero0 = s32[] constant(0)
  %init = (s32[], bf16[8,32]{1,0}, bf16[3,32,16]{2,1,0}) tuple(%zero0, %x0, %w0)
  %loop = (s32[], bf16[8,32]{1,0}, bf16[3,32,16]{2,1,0}) while(%init), condition=%cond, body=%body, TRIP
  ROOT %res = bf16[8,32]{1,0} get-tuple-element(%loop), index=1
}
"""
GPU_HLO = GPU_HLO.replace("TRITON", 'backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}')
GPU_HLO = GPU_HLO.replace("TRIP", 'backend_config={"known_trip_count":{"n":"3"}}')


def _by_name(kernels: list[Kernel]) -> dict[str, Kernel]:
  return {k.name: k for k in kernels}


def test_gemm_flops_and_type_come_from_the_dot_inside_the_fusion():
  k = _by_name(perfmodel_hlo.kernels(GPU_HLO))["y"]
  assert (k.kind, k.dtype, k.flops, k.shape) == ("gemm", "bf16", 2 * 8 * 16 * 32, "8x16x32")
  assert k.bytes == 2 * (8 * 32 + 32 * 16 + 8 * 16)  # operands once, output once


def test_loop_body_kernels_run_once_per_trip_and_the_condition_is_free():
  ks = perfmodel_hlo.kernels(GPU_HLO)
  assert {k.name: k.count for k in ks} == {"layer": 3, "y": 3, "z": 3}


def test_a_sliced_weight_stack_is_read_as_its_slice():
  layer = _by_name(perfmodel_hlo.kernels(GPU_HLO))["layer"]
  assert layer.bytes == 2 * 32 * 16 + 4 + 2 * 32 * 16  # one layer read, the index, one layer written


def test_elementwise_fusion_counts_its_arithmetic_but_not_its_data_movement():
  z = _by_name(perfmodel_hlo.kernels(GPU_HLO))["z"]
  assert (z.kind, z.vector_ops) == ("memory", {"bf16": 2 * 8 * 16})  # tanh and multiply; the parameter is free


def test_named_scopes_of_s3r_reach_the_kernel_groups():
  x = jnp.ones((1, 64, 32), jnp.bfloat16)
  w = jnp.ones((32, 48), jnp.float32)

  def loss(x, w, key):
    from s3r import qmatmul

    return jnp.sum(qmatmul(x, w, key=key, recipe="s3r_ec_dx").astype(jnp.float32))

  text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w, jax.random.key(0)).compile().as_text() or ""
  groups = {k.group for k in perfmodel_hlo.kernels(text)}
  assert {"s3r_quantize", "s3r_ec"} <= groups, groups


def test_kernel_time_is_the_larger_of_compute_and_memory_plus_launch():
  t = pm.target("h200")
  c = pm.Constants(e_bf16=0.5, e_s8=0.25, c0=1e-5, e_mem=0.5, launch=4e-6)
  gemm = Kernel("g", "gemm", 1, bytes=10**6, flops=1e12, dtype="bf16")
  assert pm.kernel_seconds(gemm, t, c) == pytest.approx(1e-5 + 1e12 / (0.5 * 989.4e12) + 4e-6)
  s8 = Kernel("q", "gemm", 1, bytes=10**6, flops=1e12, dtype="s8")
  assert pm.kernel_seconds(s8, t, c) == pytest.approx(pm.kernel_seconds(gemm, t, c), rel=1e-4)  # half e, twice the peak
  copy = Kernel("m", "memory", 1, bytes=10**9, vector_ops={"f32": 1e6})
  assert pm.kernel_seconds(copy, t, c) == pytest.approx(1e9 / (0.5 * 4.8e12) + 4e-6)
  hash_ = Kernel("h", "memory", 1, bytes=10**3, vector_ops={"u32": 1e12})
  assert pm.kernel_seconds(hash_, t, c) == pytest.approx(1e12 / t.vector_rate("u32") + 4e-6)


def test_vector_rates_are_xla_s_description_of_the_gpu():
  t = pm.target("h100")
  assert t.vector["f32"] == pytest.approx(132 * 128 * 1.98e9)  # cores x FP32 lanes x clock
  assert t.vector["s32"] == pytest.approx(132 * 64 * 1.98e9)


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_published_tensor_core_peaks_agree_with_xla_s_description(name):
  """The datasheet peaks of peaks.toml against the matrix units of XLA's target file (2 FLOPs per FMA)."""
  text = (pm.TARGETS_DIR / pm.tomllib.loads((pm.TARGETS_DIR / "peaks.toml").read_text())[name]["txtpb"]).read_text()
  cores = int(pm._field(r"core_count:\s*(\d+)", text))
  matrix = text[text.index("matrix_unit_description") :]
  rates = {}
  for block in re.findall(r"rate_infos\s*\{(.*?)\n    \}", matrix, re.S):
    key = int(pm._field(r"key:\s*(\d+)", block))
    fields = [
      float(pm._field(rf"{f}:\s*([\d.]+)", block)) for f in ("clock_rate_ghz", "units_per_core", "ops_per_clock")
    ]
    rates[pm.PRIMITIVE.get(key)] = 2 * cores * math.prod(fields) * 1e9
  t = pm.target(name)
  for dtype, xla in (("s8", "s8"), ("bf16", "f16"), ("f32", "f32")):
    assert t.gemm[dtype] == pytest.approx(rates[xla], rel=0.01), dtype


def test_fit_recovers_the_constants_that_made_the_times():
  t = pm.target("h200")
  truth = pm.Constants(e_bf16=0.62, e_s8=0.31, c0=3e-5, e_mem=0.8, launch=6e-6)
  rng = np.random.default_rng(0)
  programs = []
  for _ in range(24):
    f, b = 10 ** rng.uniform(9, 13), 10 ** rng.uniform(6, 9)
    ks = [Kernel("a", "gemm", 1, bytes=int(b), flops=f, dtype="bf16"),
          Kernel("b", "gemm", 1, bytes=int(b), flops=f * rng.uniform(0.5, 2), dtype="s8"),
          Kernel("c", "memory", int(rng.integers(1, 40)), bytes=int(b * rng.uniform(0.1, 3)))]  # fmt: skip
    programs.append((ks, pm.program_seconds(ks, t, truth)))
  fit = pm.fit(lambda c: np.array([math.log(pm.program_seconds(ks, t, c) / s) for ks, s in programs]))
  for name in pm.CONSTANTS:
    assert getattr(fit.constants, name) == pytest.approx(getattr(truth, name), rel=0.02, abs=1e-7), name


def test_order_check_ignores_ties_and_finds_swaps():
  meas = {"a": 1.0, "b": 1.01, "c": 1.5}
  assert perfmodel_validate._order_misses({"a": 1.02, "b": 1.0, "c": 1.6}, meas) == []  # a/b within 3%: a tie
  assert perfmodel_validate._order_misses({"a": 1.7, "b": 1.0, "c": 1.6}, meas) == ["a/c"]


@pytest.mark.slow  # refits the constants: about 20 s each on two idle cores
@pytest.mark.parametrize("target", ["h200", "v5p"])
def test_committed_validation_is_what_the_committed_kernels_give(target):
  results = RESULTS / f"bench_perfmodel_validate_{target}_cpu.json"
  if not results.is_file():
    pytest.skip(f"{results.name} not committed")
  doc = json.loads(results.read_text())
  kernels = REPO / doc["settings"]["kernels"]
  if target == "h200":
    again = perfmodel_validate.h200(
      kernels, REPO / "results/bench_ffn_gpu.json", REPO / "results/bench_quantizer_gpu.json"
    )
  else:
    again = perfmodel_validate.v5p(kernels)
  assert again["summary"] == pytest.approx(doc["results"]["summary"], rel=1e-6)
  assert again["passed"] == doc["results"]["passed"]


def test_program_time_is_the_sum_of_its_kernel_times():
  t = pm.target("h100")
  c = pm.Constants(e_bf16=0.6, e_s8=0.3, c0=2e-5, e_mem=0.5, launch=5e-6)
  ks = perfmodel_hlo.kernels(GPU_HLO) + [Kernel("ar", "collective", 2, bytes=10**6)]
  assert pm.program_seconds(ks, t, c) == pytest.approx(sum(k.count * pm.kernel_seconds(k, t, c) for k in ks))


def test_speed_model_doc_shows_the_committed_h200_validation():
  from benchmarks import perfmodel_report

  doc = (REPO / "docs" / "speed-model.md").read_text()
  result = json.loads((RESULTS / "bench_perfmodel_validate_h200_cpu.json").read_text())["results"]
  assert perfmodel_report.doc_table_h200(result) in doc


def test_speed_model_doc_shows_the_committed_v5p_validation_and_predicted_steps():
  from benchmarks import perfmodel_report

  doc = (REPO / "docs" / "speed-model.md").read_text()
  load = lambda name: json.loads((RESULTS / name).read_text())["results"]
  if (RESULTS / "bench_perfmodel_validate_v5p_cpu.json").is_file():
    assert perfmodel_report.doc_table_v5p(load("bench_perfmodel_validate_v5p_cpu.json")) in doc
  targets = [t for t in ("h100", "h200", "v5p") if (RESULTS / f"bench_perfmodel_predict_{t}_cpu.json").is_file()]
  assert targets, "no predicted steps committed"
  steps = {t: load(f"bench_perfmodel_predict_{t}_cpu.json") for t in targets}
  assert perfmodel_report.doc_table_steps(steps) in doc
  assert perfmodel_report.doc_table_ffn(load("bench_perfmodel_predict_h200_ffn_cpu.json")) in doc


def test_unfused_slices_and_in_place_updates_move_only_the_slice():
  text = GPU_HLO.replace(
    "  %z = bf16[8,16]{1,0} fusion(%y), kind=kLoop, calls=%act_computation\n",
    "  %z = bf16[8,16]{1,0} fusion(%y), kind=kLoop, calls=%act_computation\n"
    "  %ds2 = bf16[1,32,16]{2,1,0} dynamic-slice(%w, %i, %i, %i), dynamic_slice_sizes={1,32,16}\n"
    "  %dus = bf16[3,32,16]{2,1,0} dynamic-update-slice(%w, %ds2, %i, %i, %i)\n",
  )
  ks = _by_name(perfmodel_hlo.kernels(text))
  assert ks["ds2"].bytes == 2 * 2 * 32 * 16 and ks["dus"].bytes == 2 * 2 * 32 * 16


def test_a_loop_without_a_printed_trip_count_runs_as_often_as_its_condition_says():
  text = GPU_HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")  # as XLA:TPU prints a scan
  assert "known_trip_count" not in text
  assert {k.name: k.count for k in perfmodel_hlo.kernels(text, tpu=True)} == {"layer": 3, "y": 3, "z": 3}
