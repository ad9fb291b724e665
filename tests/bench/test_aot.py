"""`python -m benchmarks aot`: GPU programs compiled on the CPU. The default suite checks the refusal without the
`gpu-aot` (or `tpu-aot`) extra and the GEMM census of an XLA:GPU (and an XLA:TPU) HLO text; the slow tests compile for the H100 target (skipped,
with the reason, where JAX's CUDA plugin is not installed)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from typing import cast

import pytest

from benchmarks import aot, aot_report, cli
from tests.faults.conftest import REPO

needs_plugin = pytest.mark.skipif(
  not aot.cuda_plugin_installed(),
  reason="JAX's CUDA plugin is not installed (pip install -e '.[gpu-aot]' -c constraints.txt)",
)

GPU_HLO = """HloModule jit_f, entry_computation_layout={(s8[64,32]{1,0}, s8[32,16]{1,0})->f32[64,16]{1,0}}

%gemm_fusion_dot.1_computation (p0: s8[64,32], p1: s8[32,16]) -> s32[64,16] {
  %p0 = s8[64,32]{1,0} parameter(0)
  %p1 = s8[32,16]{1,0} parameter(1)
  ROOT %dot.1 = s32[64,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: s8[64,32], b: s8[32,16], c: bf16[64,32], d: bf16[32,16]) -> f32[64,16] {
  %a = s8[64,32]{1,0} parameter(0)
  %b = s8[32,16]{1,0} parameter(1)
  %c = bf16[64,32]{1,0} parameter(2)
  %d = bf16[32,16]{1,0} parameter(3)
  %gemm_fusion_dot.1 = s32[64,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot.1_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %custom-call.1 = (bf16[64,16]{1,0}, s8[0]{0}) custom-call(%c, %d), custom_call_target="__cublas$gemm"
  %custom-call.2 = (bf16[64,16]{1,0}, s8[0]{0}) custom-call(%c, %d), custom_call_target="__cublas$lt$matmul"
  %custom-call.3 = (bf16[1,64,4,16]{3,2,1,0}, u8[0]{0}) custom-call(%c, %d, %d), custom_call_target="__cudnn$fmhaSoftmax"
  %custom-call.4 = f32[64,16]{1,0} custom-call(%a, %b), custom_call_target="__gpu$xla.gpu.triton"
  %e = f8e5m2[64,32]{1,0} parameter(4)
  %f = f8e4m3fn[32,16]{1,0} parameter(5)
  %one = f32[] constant(1)
  %custom-call.5 = (f32[64,16]{1,0}, s8[0]{0}) custom-call(%e, %f, %one, %one), custom_call_target="__cublas$lt$matmul$f8"
  ROOT %convert.1 = f32[64,16]{1,0} convert(%gemm_fusion_dot.1)
}
"""


def test_gemm_kinds_names_triton_cublas_cublaslt_cudnn_and_pallas_gemms_of_a_gpu_program():
  assert aot_report.gemm_kinds(GPU_HLO) == {
    "cublas": 1,
    "cublaslt": 1,
    "cublaslt_f8 f8e5m2 x f8e4m3fn": 1,
    "cudnn_attention": 1,
    "pallas_triton": 1,
    "triton_gemm s8 x s8": 1,
  }


def test_native_fp8_gemms_are_cublaslt_f8_calls_and_triton_gemms_on_two_fp8_operands():
  gemms = {
    "cublaslt_f8 f8e5m2 x f8e4m3fn": 2,
    "triton_gemm f8e4m3fn x f8e4m3fn": 3,
    "triton_gemm f8e5m2 x f8e5m2": 1,
    "triton_gemm f32 x f32": 5,  # an FP8 code emulated in f32
    "triton_gemm bf16 x f8e4m3fn": 7,  # one operand converted: not an FP8 GEMM
    "cublaslt": 4,
  }
  assert aot_report.fp8_gemms(gemms) == 6
  assert aot_report.hlo_summary(GPU_HLO)["fp8_gemms"] == 1


def test_aot_refuses_in_one_message_naming_the_extra_when_the_cuda_plugin_is_missing(monkeypatch):
  monkeypatch.setattr(aot, "cuda_plugin_installed", lambda: False)
  args = cli.build_parser().parse_args(["aot", "--program", "ffn"])
  with pytest.raises(SystemExit) as e:
    aot.run(args)
  assert "gpu-aot" in str(e.value) and "pip install" in str(e.value)


def test_aot_refuses_the_v5p_target_in_one_message_naming_the_tpu_extra_when_libtpu_is_missing(monkeypatch):
  monkeypatch.setattr(aot, "tpu_plugin_installed", lambda: False)
  args = cli.build_parser().parse_args(["aot", "--target", "v5p", "--program", "ffn"])
  with pytest.raises(SystemExit) as e:
    aot.run(args)
  assert "tpu-aot" in str(e.value) and "pip install" in str(e.value)


TPU_HLO = """HloModule jit_f, entry_computation_layout={(s8[256,512]{1,0}, s8[512,128]{1,0})->s32[256,128]{1,0}}

%fused_computation (param_0: s8[256,512], param_1: s8[512,128]) -> s32[256,128] {
  %param_0 = s8[256,512]{1,0:T(8,128)(4,1)} parameter(0)
  %param_1 = s8[512,128]{1,0:T(8,128)(4,1)} parameter(1)
  ROOT %convolution.1 = s32[256,128]{1,0:T(8,128)} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%fused_computation.1 (param_0.1: bf16[256,512], param_1.1: bf16[512,128]) -> f32[256,128] {
  %param_0.1 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1.1 = bf16[512,128]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.2 = f32[256,128]{1,0:T(8,128)} convolution(%param_0.1, %param_1.1), dim_labels=bf_io->bf
}

ENTRY %main.1 (a.1: s8[256,512], b.1: s8[512,128], c.1: bf16[256,512], d.1: bf16[512,128]) -> s32[256,128] {
  %a.1 = s8[256,512]{1,0:T(32,128)(4,1)} parameter(0)
  %b.1 = s8[512,128]{1,0:T(32,128)(4,1)} parameter(1)
  %c.1 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(2)
  %d.1 = bf16[512,128]{1,0:T(8,128)(2,1)} parameter(3)
  %fusion.1 = f32[256,128]{1,0:T(8,128)} fusion(%c.1, %d.1), kind=kOutput, calls=%fused_computation.1
  %custom-call.1 = s32[4]{0:T(128)} custom-call(%a.1), custom_call_target="tpu_custom_call"
  ROOT %fusion = s32[256,128]{1,0:T(8,128)} fusion(%a.1, %b.1), kind=kOutput, calls=%fused_computation
}
"""


def test_tpu_gemm_kinds_counts_convolutions_by_operand_and_result_types_inside_fusions():
  assert aot_report.tpu_gemm_kinds(TPU_HLO) == {
    "convolution bf16 x bf16 -> f32": 1,
    "convolution s8 x s8 -> s32": 1,
    "mosaic_kernel": 1,
  }
  assert aot_report.hlo_summary(TPU_HLO, tpu=True)["fusions"] == {"kOutput": 2}


def test_no_xla_gpu_option_is_given_to_a_tpu_compile_unless_asked():
  assert aot.compiler_options(None, tpu=True) == {}
  assert aot.compiler_options(["xla_tpu_some_flag=true"], tpu=True) == {"xla_tpu_some_flag": True}


def test_xla_options_are_typed_name_value_pairs_and_autotuning_is_off_unless_given():
  assert aot.compiler_options(None) == {"xla_gpu_autotune_level": 0}
  got = aot.compiler_options(["--xla_gpu_enable_triton_gemm=false", "xla_gpu_autotune_level=4", "xla_dump_to=/tmp/d"])
  assert got == {"xla_gpu_autotune_level": 4, "xla_gpu_enable_triton_gemm": False, "xla_dump_to": "/tmp/d"}
  with pytest.raises(SystemExit, match="NAME=VALUE"):
    aot.compiler_options(["triton"])


def _aot(tmp_path, *args) -> list[dict]:
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-m", "benchmarks", "aot", "--target", "h100", "--out-dir", str(tmp_path), *args]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (path,) = tmp_path.glob("bench_aot_h100*_cpu.json")
  doc = json.loads(path.read_text())
  assert doc["complete"] and doc["settings"]["target_device"] == "NVIDIA H100 80GB HBM3"
  return doc["results"]


@pytest.mark.slow
@needs_plugin
def test_a_tiny_train_step_compiles_for_the_h100_with_int8_triton_gemms_and_cudnn_attention(tmp_path):
  rows = _aot(
    tmp_path, "--program", "step", "--preset", "tiny", "--layers", "1", "--batch", "2", "--seq", "64",
    "--recipes", "bf16,s3r_ec_dx", "--breakdown",
  )  # fmt: skip
  by = {r["recipe"]: r for r in rows}
  for r in by.values():
    assert "error" not in r, r.get("error")
    assert r["compile_s"] > 0 and r["memory"]["temp"] > 0 and r["breakdown"]["peak"] and r["breakdown"]["heap"]
    assert r["hlo"]["gemms"].get("cudnn_attention", 0) >= 2  # forward and backward
  assert by["s3r_ec_dx"]["hlo"]["gemms"].get("triton_gemm s8 x s8", 0) >= 9  # 3 int8 GEMMs per projection
  assert not any("s8" in k for k in by["bf16"]["hlo"]["gemms"])


@pytest.mark.slow
@needs_plugin
def test_every_projection_gemm_of_the_bf16_ffn_block_and_train_step_takes_bf16_operands_for_the_h100(tmp_path):
  # Forward, dX and dW on bf16 operands with f32 accumulation (s3r/quant/bf16.py), as a bf16 dense layer of Flax
  # computes them. The train step's other GEMMs (the f32 logits' backward, attention) are every recipe's: the
  # int8 recipe's program has the same f32 x f32 ones.
  ffn = _aot(tmp_path / "ffn", "--program", "ffn", "--shapes", "W1", "--tokens", "16384", "--recipes", "bf16")
  assert ffn[0]["hlo"]["gemms"] == {"triton_gemm bf16 x bf16": 8}, ffn[0]["hlo"]["gemms"]  # gate, up merged fwd
  args = ["--program", "step", "--preset", "tiny", "--layers", "1", "--batch", "2", "--seq", "64"]
  step = {r["recipe"]: r["hlo"]["gemms"] for r in _aot(tmp_path / "step", *args, "--recipes", "bf16,int8_rtne")}
  bf16, f32, int8 = "triton_gemm bf16 x bf16", "triton_gemm f32 x f32", step["int8_rtne"]
  assert set(step["bf16"]) == {"cudnn_attention", bf16, f32} and step["bf16"][f32] == int8[f32], step
  assert step["bf16"][bf16] == int8["triton_gemm s8 x s8"] + int8.get(bf16, 0), step  # each int8 GEMM a bf16 one


def _without_fp8(gemms: dict[str, int], native: str) -> dict[str, int]:
  """The GEMM census without the GEMMs on two operands of the `native` kind (FP8, or s8)."""
  types = aot_report.FP8_TYPES if native == "f8" else ("s8",)
  keep = {}
  for kind, n in gemms.items():
    operands = kind.partition(" ")[2].split(" x ")
    if not (len(operands) == 2 and all(t in types for t in operands)):
      keep[kind] = n
  return keep


@pytest.mark.slow
@needs_plugin
@pytest.mark.parametrize("program", ["ffn", "step"])
def test_every_gemm_on_codes_of_an_all_fp8_recipe_is_a_native_fp8_gemm_for_the_h100(program, tmp_path):
  # The int8 recipe's program with every int8 GEMM an FP8 one: the other GEMMs (unquantized head, attention,
  # S3R-EC's small bf16 correction products) are the same, so no FP8 code reaches a GEMM through an f32 or bf16
  # conversion. The int8 forward with FP8 gradients is the contrast: a mixed product, emulated in f32.
  shape = ["--shapes", "256x512", "--tokens", "512"] if program == "ffn" else ["--preset", "tiny", "--batch", "2"]
  recipes = "s3r,s3r@e5m2+fwd_e4m3,s3r@e4m3+fwd_e4m3,s3r@e5m2"
  rows = _aot(tmp_path, "--program", program, *shape, "--seq", "64", "--recipes", recipes)
  by = {r["recipe"]: r["hlo"] for r in rows}
  assert all("error" not in r for r in rows), [r.get("error") for r in rows]
  int8 = by["s3r"]["gemms"]
  for name in ("s3r@e5m2+fwd_e4m3", "s3r@e4m3+fwd_e4m3"):
    assert by[name]["fp8_gemms"] >= 3, by[name]["gemms"]  # at least one linear's three GEMMs
    assert _without_fp8(by[name]["gemms"], "f8") == _without_fp8(int8, "s8"), by[name]["gemms"]
  assert by["s3r@e5m2"]["fp8_gemms"] == 0 and "triton_gemm f32 x f32" in by["s3r@e5m2"]["gemms"]


@pytest.mark.slow
@needs_plugin
def test_the_int8_and_bf16_grouped_gemms_are_the_pallas_kernels_for_the_h100_target(tmp_path):
  """Forward, dX and dW of the int8 (s3r) and the bf16 recipe are the three Pallas (Triton) kernels, and no other
  GEMM remains: no ragged dot expanded into E masked products, no tiled loop of XLA GEMMs."""
  rows = _aot(
    tmp_path, "--program", "moe", "--moe-shape", "256x128x8", "--moe-tokens", "512", "--moe-impl", "auto",
    "--recipes", "s3r,bf16", "--xla", "xla_gpu_enable_cub_radix_sort=false",
  )  # fmt: skip
  assert len(rows) == 2 and all("error" not in r for r in rows), [r.get("error") for r in rows]
  for row in rows:
    assert row["hlo"]["gemms"] == {"pallas_triton": 3}, (row["recipe"], row["hlo"]["gemms"])


@pytest.mark.slow
@needs_plugin
def test_the_all_fp8_grouped_gemms_compile_to_fp8_gemms_for_the_h100_target_on_every_impl(tmp_path):
  """E4M3 forward and E5M2 gradients: the forward, dX and dW grouped GEMMs are FP8 GEMMs (the Pallas kernels
  take int8 codes only, so "auto" runs them on the tiled and ragged paths)."""
  rows = _aot(
    tmp_path, "--program", "moe", "--moe-shape", "256x128x4", "--moe-tokens", "512", "--moe-impl", "auto,ragged,tiled",
    "--recipes", "s3r_ec_dx@e5m2+fwd_e4m3",
  )  # fmt: skip
  assert len(rows) == 3 and all("error" not in r for r in rows), [r.get("error") for r in rows]
  for row in rows:
    gemms = row["hlo"]["gemms"]
    assert row["hlo"]["fp8_gemms"] == 3 and "pallas_triton" not in gemms, (row["impl"], gemms)


def test_the_h100_and_h200_target_descriptions_are_in_the_repository():
  for name in aot.TARGETS:
    assert "gpu_device_info" in aot.target_spec(name)
  with pytest.raises(SystemExit, match="--target"):
    aot.target_spec("no-such-gpu")


XLA_LOG = """I1206 13:09:04.089555   21557 hlo_pass_pipeline.cc:206] HLO pass: algsimp time: 6 us (6 us) (cumulative: 6 us, max: 6 us, #called: 1)
I1206 13:09:04.089578   21557 hlo_pass_pipeline.cc:206] HLO pass: config-assigner time: 2.5 s (2.5 s) (cumulative: 2.5 s, max: 2.5 s, #called: 1)
I1206 13:09:04.089579   21557 hlo_pass_pipeline.cc:206] HLO pass: algsimp time: 4 ms (4 ms) (cumulative: 4 ms, max: 4 ms, #called: 2)
I1206 13:10:07.800997   22300 gpu_compiler.cc:263] GpuCompiler::RunHloPasses for jit_f time: 3.1 s (3100000 us) (cumulative: 3.1 s, max: 3.1 s, #called: 1)
I1206 13:10:08.100000   22300 nvptx_compiler.cc:658] NVPTXCompiler::CompileTargetBinary - PtxToCubin for jit_f time: 620 ms (619894 us) (cumulative: 620 ms, max: 620 ms, #called: 1)
I1206 13:10:08.200000   22300 nvptx_compiler.cc:658] NVPTXCompiler::CompileTargetBinary - PtxToCubin for jit_f time: 380 ms (380106 us) (cumulative: 1 s, max: 620 ms, #called: 2)
"""


def test_xla_timers_sums_each_phase_and_each_hlo_pass_over_its_calls():
  t = aot_report.xla_timers(XLA_LOG)
  assert t["phases_s"] == {"GpuCompiler::RunHloPasses": 3.1, "NVPTXCompiler::CompileTargetBinary - PtxToCubin": 1.0}
  assert t["phase_calls"]["NVPTXCompiler::CompileTargetBinary - PtxToCubin"] == 2
  assert t["top_passes_s"] == {"config-assigner": 2.5, "algsimp": 0.004}
  assert t["hlo_passes_s"] == 2.504


@pytest.mark.slow
@needs_plugin
def test_deviceless_h200_memory_is_byte_for_byte_what_the_h200_itself_reported(tmp_path):
  """results/bench_static_gpu.json: memory_analysis() of the FFN block compiled on a real H200. Every program
  has changed since (the INT8 ones by numerics.rescaled, `bf16` by its bf16 backward GEMMs, s3r/quant/bf16.py);
  `bf16`'s temporaries at W1 stayed those measured there (the same four bf16 [T, D_ffn] arrays at its peak), so
  its bytes are compared."""
  gpu = json.loads((REPO / "results" / "bench_static_gpu.json").read_text())
  (w1,) = [row for row in gpu["results"]["ffn_memory"] if row["shape"] == "W1"]
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  args = ["--target", "h200", "--program", "ffn", "--shapes", "W1", "--tokens", str(w1["tokens"])]
  cmd = [sys.executable, "-m", "benchmarks", "aot", *args, "--recipes", "bf16", "--out-dir", str(tmp_path)]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (path,) = tmp_path.glob("bench_aot_h200_cpu.json")
  for row in json.loads(path.read_text())["results"]:
    assert row["memory"]["temp"] == w1["recipes"][row["recipe"]]["temp_size_in_bytes"], row["recipe"]


def _row(layout, layers, recipe, wall, cpu):
  return {
    "program": "step", "preset": "llama3.1-8b", "layout": layout, "layers": layers, "recipe": recipe,
    "lower_s": 1.0, "compile_s": wall - 1.0, "lower_cpu_s": 1.0, "compile_cpu_s": cpu - 1.0,
  }  # fmt: skip


def test_depth_ratios_divide_the_deepest_by_the_shallowest_compile_per_layout_and_recipe():
  rows = [
    _row("scan", 2, "s3r", 10.0, 8.0),
    _row("scan", 32, "s3r", 11.0, 10.0),
    _row("unrolled", 2, "s3r", 10.0, 8.0),
    _row("unrolled", 32, "s3r", 60.0, 40.0),
    {**_row("scan", 32, "bf16", 1.0, 1.0), "error": "did not compile"},  # no pair: left out
    _row("scan", 2, "bf16", 5.0, 5.0),
  ]
  got = {(d["layout"], d["recipe"]): d for d in aot_report.depth_ratios(rows)}
  assert set(got) == {("scan", "s3r"), ("unrolled", "s3r")}
  assert got[("scan", "s3r")]["wall_ratio"] == 1.1 and got[("scan", "s3r")]["cpu_ratio"] == 1.25
  assert got[("unrolled", "s3r")]["wall_s"] == [10.0, 60.0] and got[("unrolled", "s3r")]["cpu_ratio"] == 5.0
  text = "\n".join(aot_report.depth_table(rows))
  assert "| step llama3.1-8b, scan | s3r | 10.0 | 11.0 | 1.10 | 8.0 | 10.0 | 1.25 | yes |" in text
  assert "| step llama3.1-8b, unrolled | s3r | 10.0 | 60.0 | 6.00 | 8.0 | 40.0 | 5.00 | no |" in text


def test_the_step_programs_are_planned_per_layout_depth_and_recipe():
  args = cli.build_parser().parse_args(
    ["aot", "--program", "step", "--layers", "2,32", "--layout", "scan,unrolled", "--recipes", "bf16,s3r"]
  )
  todo = aot.plan(args, ["bf16", "s3r"])
  got = [(labels["layout"], labels["layers"], labels["recipe"]) for labels, _ in todo]
  assert len(got) == 8 and len(set(got)) == 8
  scan_of = {(labels["layout"], cast(functools.partial, lower).keywords["scan"]) for labels, lower in todo}
  assert scan_of == {("unrolled", False), ("scan", True)}


TEMP_TABLE = "FFN block temporary memory, TPU v5p and H100 targets"
TEMP_FILES = {
  "v5p": "results/aot/bench_aot_v5p_ffn_breakdown_cpu.json",
  "H100": "results/aot/bench_aot_h100_ffn_cpu.json",
}
RECIPE_ORDER = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")
# what a table row reports of one compiled program: memory_analysis()'s temp bytes; the temp block XLA's buffer
# assignment allocates in device memory (its largest temp allocation); the most bytes live in that block at once
MEASURES = {
  "memory_analysis()": lambda r: r["memory"]["temp"],
  "allocated": lambda r: r["breakdown"]["heap"][0]["bytes"],
  "live at most": lambda r: r["breakdown"]["heap"][0]["live_peak_bytes"],
}


def _measure_rows(path: str, recipes: tuple[str, ...], measures: list[str], prefix=lambda r: []) -> list[list[str]]:
  """Docs table rows: per configuration (a results row's shape, if any) and measure, MiB per recipe, the INT8 recipes
  with their ratio to bf16."""
  by: dict[str, dict[str, dict]] = {}
  for r in json.loads((REPO / path).read_text())["results"]:
    by.setdefault(r.get("shape", ""), {})[r["recipe"]] = r
  rows = []
  for group in by.values():
    for measure in measures:
      value = {k: MEASURES[measure](r) for k, r in group.items()}
      base = value["bf16"]
      cells = [
        f"{value[k] / aot_report.MIB:,.0f}" + ("" if k == "bf16" else f" ({value[k] / base:.2f}x)") for k in recipes
      ]
      rows.append([*prefix(group["bf16"]), measure, *cells])
  return rows


def _docs_table(title: str, nth: int = 0) -> list[list[str]]:
  text = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("performance*.md")))  # one page per hardware
  section = text.split(f"### {title}\n", 1)[1].split("\n#", 1)[0]
  tables = [[]]
  for ln in section.splitlines():
    if ln.startswith("|"):
      tables[-1].append(ln)
    elif tables[-1]:
      tables.append([])
  return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in tables[nth][2:]]


def test_the_tpu_and_h100_temporary_memory_table_of_the_docs_is_the_committed_results():
  want = []
  for target, path in TEMP_FILES.items():
    measures = list(MEASURES) if target == "v5p" else ["allocated", "live at most"]  # a GPU's temp is its block
    want += _measure_rows(path, RECIPE_ORDER, measures, prefix=lambda r, t=target: [t, r["shape"]])
  assert _docs_table(TEMP_TABLE) == want


STEP_TABLE = "Train step of `paper-12l` at 2 layers, TPU v5p target"


def _step_rows(path: str) -> list[list[str]]:
  """The docs table's rows: temporary MiB and compile CPU seconds per recipe, INT8 recipes with their ratio to bf16."""
  by = {r["recipe"]: r for r in json.loads((REPO / path).read_text())["results"]}
  temp = {r: by[r]["memory"]["temp"] / aot_report.MIB for r in RECIPE_ORDER}
  cpu = {r: by[r]["compile_cpu_s"] for r in RECIPE_ORDER}
  rows = []
  for label, values, fmt in (("temp MiB", temp, ",.0f"), ("compile CPU s", cpu, ".1f")):
    base = values["bf16"]
    cells = [format(values[r], fmt) + ("" if r == "bf16" else f" ({values[r] / base:.2f}x)") for r in RECIPE_ORDER]
    rows.append([label, *cells])
  return rows


def test_the_v5p_train_step_tables_of_the_docs_are_the_committed_results():
  assert _docs_table(STEP_TABLE, 0) == _step_rows("results/aot/bench_aot_v5p_step_cpu.json")
  recipes = ("bf16", "int8_rtne", "int8_sr", "s3r_ec_dx")
  want = _measure_rows("results/aot/bench_aot_v5p_step_breakdown_cpu.json", recipes, list(MEASURES))
  assert _docs_table(STEP_TABLE, 1) == want


def test_the_h100_train_step_memory_table_of_the_docs_is_the_committed_results():
  want = _measure_rows(
    "results/aot/bench_aot_h100_step2_breakdown_cpu.json", RECIPE_ORDER, ["allocated", "live at most"]
  )
  assert _docs_table(STEP2_TABLE) == want


STEP2_TABLE = "Train step of `paper-12l` at 2 layers, H100 target: memory"


_FFN_HLO = """
import sys
from benchmarks import aot, aot_programs
aot.use_cpu_host()
mesh = aot.target_mesh(aot.target_devices("h100"))
lowered = aot_programs.lower_ffn(mesh, sys.argv[1], 16384, 256, 2048)
print(lowered.compile(compiler_options=aot.compiler_options(None)).as_text())
"""


def _h100_ffn_hlo(recipe: str) -> str:
  """The optimized HLO of the FFN block for the H100 target, T = 16384, (H, F) = (256, 2048): large enough
  that XLA keeps the gate and up GEMMs apart (it merges small GEMMs that share an operand)."""
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-c", _FFN_HLO, recipe]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _readers(entry: str, name: str) -> list[str]:
  return [ln for ln in entry.splitlines() if re.search(rf"[(,] ?%{re.escape(name)}[,)]", ln)]


@pytest.mark.slow
@needs_plugin
@pytest.mark.parametrize("recipe", ["int8_rtne", "s3r_ec_dx"])
def test_each_forward_int8_gemm_product_of_the_h100_ffn_is_read_once_by_its_own_rescale(recipe):
  # XLA:GPU's Triton GEMM writes the f32 product of a forward GEMM (scales computed in the program cannot join
  # its epilogue). Read once, the product dies at its rescale: it is neither merged with the other projection's
  # rescale nor recomputed inside the backward pass (numerics.rescaled). The rescale is the CPU's expression:
  # times the token scales, times the channel scales, cast to bf16.
  text = _h100_ffn_hlo(recipe)
  entry = text[text.index("\nENTRY") :]
  products = re.findall(r"%(\S+) = f32\[16384,2048\]\{1,0\} fusion\(.*kind=kCustom.*/jvp\(\)/dot_general\"", entry)
  assert len(products) == 2, products  # gate and up (the block's output is not part of its gradient)
  for name in products:
    (barrier,) = _readers(entry, name)
    tup = re.match(r"\s*%(\S+) = \(", barrier)
    assert tup, barrier
    (acc,) = re.findall(
      rf"%(\S+) = f32\[16384,2048\]\{{1,0\}} get-tuple-element\(%{re.escape(tup.group(1))}\), index=0", entry
    )
    (rescale,) = _readers(entry, acc)
    called = re.search(r"calls=%(\S+?),", rescale)
    assert called and " bf16[16384,2048]" in rescale, rescale
    body = text[text.index(f"\n%{called.group(1)} ") :].split("\n}\n")[0]
    root = re.search(r"ROOT %\S+ = bf16\[16384,2048\]\{1,0\} convert\(%(\S+)\)", body)
    assert root, body
    outer = re.search(rf"%{re.escape(root.group(1))} = f32\[16384,2048\]\{{1,0\}} multiply\(%(\S+), %(\S+)\)", body)
    assert outer, body
    inner = re.search(rf"%{re.escape(outer.group(1))} = f32\[16384,2048\]\{{1,0\}} multiply\(%(\S+), %(\S+)\)", body)
    assert inner and re.search(rf"%{re.escape(inner.group(1))} = f32\[16384,2048\]\{{1,0\}} parameter", body), body
    for scale, dim in ((inner.group(2), 0), (outer.group(2), 1)):  # token scales first, then channel scales
      assert re.search(
        rf"%{re.escape(scale)} = f32\[16384,2048\]\{{1,0\}} broadcast\(.*dimensions=\{{{dim}\}}", body
      ), body


_STEP_TEMPS = """
import json, sys
from benchmarks import aot, aot_programs
aot.use_cpu_host()
import argparse
from labtools.analysis import memory
p = argparse.ArgumentParser(); aot.add_arguments(p)
args = p.parse_args(["--target", "h100", "--program", "step", "--preset", "paper-12l", "--layers", "2", "--batch", "1",
                     "--seq", "2048", "--vocab", "512", "--attention", "xla"])
mesh = aot.target_mesh(aot.target_devices("h100"))
lowered, _ = aot_programs.lower_step(mesh, sys.argv[1], "paper-12l", 2, args)
found, compiled = memory.buffer_breakdown(lowered, compiler_options=aot.compiler_options(None))
params = [a.shape for a in __import__("jax").tree.leaves(lowered.args_info[0]) if len(a.shape) == 3]
print(json.dumps({"params": params, "temps": [v["type_text"] for v in found["temp_values"]]}))
"""


@pytest.mark.slow
@needs_plugin
@pytest.mark.parametrize("recipe", ["int8_rtne", "s3r_ec_dx"])
def test_a_scanned_int8_step_for_the_h100_keeps_no_transposed_copy_of_a_stacked_weight(recipe):
  # XLA:GPU wants int8 GEMM operands contracting-dim-minor; without the weight's own layout pinned
  # (numerics.own_layout) the scan's state took that layout and XLA kept a transposed f32 copy of each
  # stacked weight [L, K, N] as [N, L, K] for the whole step.
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  proc = subprocess.run(
    [sys.executable, "-c", _STEP_TEMPS, recipe], capture_output=True, text=True, cwd=REPO, env=env, timeout=900
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = json.loads(proc.stdout.strip().splitlines()[-1])
  stacked = {tuple(s) for s in found["params"]}
  assert stacked, "the tiny model's scanned layers have stacked [L, K, N] weights"
  permuted = {tuple(sorted(s)) for s in stacked}
  shapes = [t[4 : t.index("]")].split(",") for t in found["temps"] if t.startswith("f32[")]
  dims = [tuple(int(d) for d in s) for s in shapes if len(s) == 3]
  copies = [d for d in dims if tuple(sorted(d)) in permuted and d not in stacked]
  assert not copies, copies
