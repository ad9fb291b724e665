"""`benchmarks.gemm_backends` (which kernel XLA:GPU chose per GEMM) on small HLO texts in XLA:GPU's format,
`python -m benchmarks gemm_sweep` at a tiny size on the CPU, and docs/gpu-gemms.md's census statements against
the committed deviceless files they cite."""

from __future__ import annotations

import collections
import json
import pathlib

from benchmarks import cli, gemm_backends

ROOT = pathlib.Path(__file__).resolve().parents[2]

TRITON_HLO = """HloModule jit_f

%gemm_fusion_dot_general.8_computation.0 (p0: s8[2048,16384], p1: s8[8192,16384]) -> s32[2048,8192] {
  %p0 = s8[2048,16384]{1,0} parameter(0)
  %p1 = s8[8192,16384]{1,0} parameter(1)
  ROOT %dot.3 = s32[2048,8192]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, backend_config={"sizes":["64"]}
}

%gemm_fusion_dot_general.8_computation (p0: s8[2048,16384], p1: s8[8192,16384]) -> s32[2048,8192] {
  %p0.1 = s8[2048,16384]{1,0} parameter(0)
  %p1.1 = s8[8192,16384]{1,0} parameter(1)
  ROOT %nested = s32[2048,8192]{1,0} fusion(%p0.1, %p1.1), kind=kCustom, calls=%gemm_fusion_dot_general.8_computation.0
}

ENTRY %main (a: s8[2048,16384], b: s8[8192,16384]) -> s32[2048,8192] {
  %a = s8[2048,16384]{1,0} parameter(0)
  %b = s8[8192,16384]{1,0} parameter(1)
  ROOT %gemm_fusion_dot_general.8 = s32[2048,8192]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot_general.8_computation, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{"num_warps":"4","output_tiles":[{"sizes":["64","32"]}],"num_ctas":1,"num_stages":1}}}
}
"""  # noqa: E501

CUBLAS_HLO = """HloModule jit_f

ENTRY %main (a: s8[16384,2048], b: s8[2048,8192]) -> s32[16384,8192] {
  %a = s8[16384,2048]{1,0} parameter(0)
  %b = s8[8192,2048]{1,0} parameter(1)
  %custom-call.1 = (s32[16384,8192]{1,0}, s8[33554432]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %get-tuple-element.1 = s32[16384,8192]{1,0} get-tuple-element(%custom-call.1), index=0
}
"""  # noqa: E501


def test_a_nested_triton_gemm_fusion_is_read_with_its_operand_types_sizes_and_tile():
  (row,) = gemm_backends.gemms(TRITON_HLO)
  assert row["name"] == "gemm_fusion_dot_general.8" and row["backend"] == "triton"
  assert (row["lhs"], row["rhs"], row["out"]) == ("s8", "s8", "s32")
  assert (row["m"], row["n"], row["k"], row["batch"]) == (2048, 8192, 16384, 1)
  assert row["tile"] == "64x32x64 w4 s1"  # output tile, the dot's contracting tile, warps, stages
  assert gemm_backends.launches(TRITON_HLO) == 1  # the fusion inside the GEMM fusion's body is not a launch


def test_a_cublaslt_call_is_read_with_its_sizes_from_the_gemm_config():
  (row,) = gemm_backends.gemms(CUBLAS_HLO)
  assert row["backend"] == "cublaslt" and (row["lhs"], row["rhs"], row["out"]) == ("s8", "s8", "s32")
  assert (row["m"], row["n"], row["k"]) == (16384, 8192, 2048) and row["tile"] == ""
  assert gemm_backends.census([row]) == {"cublaslt s8 x s8 -> s32": 1}
  assert gemm_backends.launches(CUBLAS_HLO) == 1


def test_gemm_sweep_times_each_gemm_and_names_its_kernel_on_the_cpu(tmp_path):
  argv = ["gemm_sweep", "--shapes", "64x128", "--tokens", "96", "--dtypes", "bf16,s8", "--repeats", "2"]
  argv += ["--number", "1", "--out-dir", str(tmp_path)]
  assert cli.main(argv) == 0
  doc = json.loads((tmp_path / "bench_gemm_sweep_cpu.json").read_text())
  rows = {(r["dtype"], r["gemm"]): r for r in doc["results"]}
  assert set(rows) == {(d, g) for d in ("bf16", "s8") for g in ("fwd", "dx", "dw")}
  assert (rows["s8", "dw"]["m"], rows["s8", "dw"]["n"], rows["s8", "dw"]["k"]) == (64, 128, 96)
  for row in rows.values():
    assert row["seconds"] > 0 and len(row["samples_s"]) == 2 and row["backend"] != "none"
  assert doc["complete"]


def _results(name: str) -> list[dict]:
  return json.loads((ROOT / "results" / "aot" / name).read_text())["results"]


def test_the_gpu_gemms_doc_census_matches_the_committed_deviceless_files():
  """docs/gpu-gemms.md: the s8 GEMMs' default tiles (19 at 64x32, 7 at 16x8, W1's dW apart), the same tiles at
  autotune level 4, and with Triton GEMMs off a cuBLASLt call per s8 GEMM with 2, 1, 3 kernels (fwd, dx, dw)."""
  default = [r for r in _results("bench_gemm_sweep_h100_cpu.json") if r["dtype"] == "s8"]
  tiles = collections.Counter(r["tile"] for r in default)
  assert tiles == {"64x32x64 w4 s1": 19, "16x8x16 w2 s1": 7, "1x16x8 w2 s1": 1}
  assert {r["backend"] for r in default} == {"triton"}
  every_type = collections.defaultdict(set)  # bf16 and FP8 get the same tiles at the same shapes
  for r in _results("bench_gemm_sweep_h100_cpu.json"):
    every_type[r["shape"], r["gemm"]].add(r["tile"])
  assert all(len(t) == 1 for t in every_type.values())
  small = sorted((r["shape"], r["gemm"]) for r in default if r["tile"] == "16x8x16 w2 s1")
  expected = [("W1", "dx"), ("W1", "fwd"), ("W2", "dw"), ("W2", "dx"), ("W3", "dw"), ("W3", "dx"), ("W4", "dw")]
  assert small == expected
  level4 = {(r["dtype"], r["shape"], r["gemm"]): r["tile"] for r in _results("bench_gemm_sweep_h100_level4_cpu.json")}
  assert level4 == {
    (r["dtype"], r["shape"], r["gemm"]): r["tile"]
    for r in _results("bench_gemm_sweep_h100_cpu.json")
    if r["shape"] in ("W3", "W9")
  }
  cublas = [r for r in _results("bench_gemm_sweep_h100_cublas_cpu.json") if r["dtype"] == "s8"]
  assert {(r["backend"], r["out"]) for r in cublas} == {("cublaslt", "s32")}
  assert {r["gemm"]: r["kernels"] for r in cublas} == {"fwd": 2, "dx": 1, "dw": 3}
  fp8 = [r for r in _results("bench_gemm_sweep_h100_cublas_cpu.json") if r["dtype"].startswith("e4m3")]
  assert {(r["backend"], r["gemm"], r["kernels"]) for r in fp8} == {
    ("cublaslt_f8", g, n) for g, n in [("fwd", 2), ("dx", 1), ("dw", 3)]
  }
  bf16 = [r for r in _results("bench_gemm_sweep_h100_cublas_cpu.json") if r["dtype"] == "bf16"]
  assert {r["kernels"] for r in bf16} == {1}
  nolt = {(r["dtype"], r["shape"], r["gemm"]): r for r in _results("bench_gemm_sweep_h100_cublas_nolt_cpu.json")}
  assert {r["backend"] for r in nolt.values()} == {"cublaslt"}
  assert [nolt["s8", "W3", g]["kernels"] for g in ("fwd", "dx", "dw")] == [4, 3, 5]


def test_the_gpu_gemms_doc_reference_point_is_the_committed_h200_ffn_time():
  """677 TOPS over the GEMMs, 34% of the 1,979 TOPS INT8 peak: int8_rtne's FFN block at W9 on the H200."""
  doc = json.loads((ROOT / "results" / "bench_ffn_gpu.json").read_text())
  (w9,) = [s for s in doc["results"] if s["shape"] == "W9"]
  seconds = w9["recipes"]["int8_rtne"]["timing"]["median_s"]
  text = (ROOT / "docs" / "gpu-gemms.md").read_text()
  assert f"ran in {seconds * 1e3:.1f} ms for {w9['gemm_flops']:.2e} GEMM operations".replace("e+", "e") in text
  tops = w9["gemm_flops"] / seconds / 1e12
  assert f"{tops:.0f} TOPS counted over the GEMMs alone, **{100 * tops / 1979:.0f}% of the INT8 peak" in text
