"""`benchmarks.trace_kernels` (per-kernel device times from a profiler trace, mapped to the optimized HLO) on a
small GPU trace written here as an XSpace text proto and on a CPU trace of a jitted program made here, and
`python -m benchmarks calibrate collect|install` on a run folder laid out as a device run leaves it. The run
itself is exercised by the dry run of scripts/device_calibrate.sh (tests/scripts, slow)."""

from __future__ import annotations

import json

import pytest

from benchmarks import calibrate, cli, trace_kernels

HLO = """HloModule jit_fwd_bwd

ENTRY %main (p: s8[64,32]) -> s32[64,16] {
  %p = s8[64,32]{1,0} parameter(0)
  %gemm_fusion_dot_general.8 = s32[64,16]{1,0} fusion(%p), kind=kCustom, calls=%c
  %custom-call.3 = (s32[64,16]{1,0}, s8[0]{0}) custom-call(%p), custom_call_target="__cublas$lt$matmul"
  ROOT %loop_convert_fusion.2 = s32[64,16]{1,0} fusion(%gemm_fusion_dot_general.8), kind=kLoop, calls=%d
}
"""


def _event(meta_id: int, offset_us: int, duration_us: int, stats: str = "") -> str:
  return (
    f"events {{ metadata_id: {meta_id} offset_ps: {offset_us * 10**6} duration_ps: {duration_us * 10**6} {stats} }}"
  )


def _gpu_trace(calls: int) -> str:
  """An XSpace with one GPU's stream line (kernels of `calls` program calls), a derived `XLA Ops` line and a
  host plane: what a jax.profiler trace of a GPU program holds, reduced to the parts the reader uses."""
  stream = []
  for c in range(calls):
    t = 1000 * c
    stream.append(_event(1, t, 500))  # a Triton GEMM kernel, named after its fusion with `_` for `.`
    stream.append(_event(2, t + 500, 300, 'stats { metadata_id: 1 str_value: "custom-call.3" }'))  # cuBLAS, hlo_op
    annotation = "stats { metadata_id: 2 ref_value: 7 }"  # CUPTI's collector: the annotation's text by reference
    stream.append(_event(3, t + 800, 100, annotation))  # an annotation not yet split into stats
    stream.append(_event(4, t + 900, 50))  # a copy that no instruction names
  derived = _event(5, 0, 99999)  # `XLA Ops`: derived from the stream line, never counted
  host = _event(6, 0, 77777)  # the host's event named like an instruction: not a device kernel
  return f"""
planes {{
  id: 1 name: "/device:GPU:0"
  lines {{ id: 1 name: "Stream #13(compute)" timestamp_ns: 1000 {" ".join(stream)} }}
  lines {{ id: 2 name: "XLA Ops" timestamp_ns: 1000 {derived} }}
  event_metadata {{ key: 1 value {{ id: 1 name: "gemm_fusion_dot_general_8" }} }}
  event_metadata {{ key: 2 value {{ id: 2 name: "sm90_xmma_gemm_s8s8_s32_tn" }} }}
  event_metadata {{ key: 3 value {{ id: 3 name: "loop_convert_fusion" }} }}
  event_metadata {{ key: 4 value {{ id: 4 name: "MemcpyD2D" }} }}
  event_metadata {{ key: 5 value {{ id: 5 name: "gemm_fusion_dot_general.8" }} }}
  stat_metadata {{ key: 1 value {{ id: 1 name: "hlo_op" }} }}
  stat_metadata {{ key: 2 value {{ id: 2 name: "kernel_annotation" }} }}
  stat_metadata {{ key: 7 value {{ id: 7 name: "loop_convert_fusion.2:#hlo_op=loop_convert_fusion.2,hlo_module=m#" }} }}
}}
planes {{
  id: 2 name: "/host:CPU"
  lines {{ id: 1 name: "python" timestamp_ns: 1000 {host} }}
  event_metadata {{ key: 6 value {{ id: 6 name: "custom-call.3" }} }}
}}
"""


def test_gpu_kernels_are_summed_per_call_under_the_hlo_instruction_that_launched_them():
  events = trace_kernels.events_from_text_proto(_gpu_trace(calls=2))
  table = trace_kernels.kernel_table(events, HLO, calls=2)
  rows = {r["name"]: r for r in table["kernels"]}
  assert set(rows) == {"gemm_fusion_dot_general.8", "custom-call.3", "loop_convert_fusion.2", "MemcpyD2D"}
  gemm, cublas, convert, copy = (
    rows[k] for k in ("gemm_fusion_dot_general.8", "custom-call.3", "loop_convert_fusion.2", "MemcpyD2D")
  )
  assert gemm["seconds"] == pytest.approx(500e-6) and gemm["count"] == 1 and gemm["hlo"]  # by the kernel's name
  assert cublas["seconds"] == pytest.approx(300e-6) and cublas["kernel_names"] == ["sm90_xmma_gemm_s8s8_s32_tn"]
  assert convert["seconds"] == pytest.approx(100e-6) and convert["hlo"]  # by the annotation, not the kernel's name
  assert not copy["hlo"] and copy["seconds"] == pytest.approx(50e-6)
  assert table["seconds"] == pytest.approx(950e-6) and table["unmapped_seconds"] == pytest.approx(50e-6)
  assert [r["name"] for r in table["kernels"]][0] == "gemm_fusion_dot_general.8"  # largest first


def test_a_cpu_trace_of_a_jitted_program_maps_its_thunks_to_the_hlo(tmp_path):
  import jax
  import jax.numpy as jnp

  from s3r.train.run import profiling

  compiled = jax.jit(lambda a, b: jnp.tanh(a @ b).sum(0)).lower(jnp.ones((128, 128)), jnp.ones((128, 128))).compile()
  a = jnp.ones((128, 128))
  jax.block_until_ready(compiled(a, a))
  with profiling.trace(tmp_path):
    for _ in range(2):
      jax.block_until_ready(compiled(a, a))
  events = trace_kernels.read_events(profiling.trace_files(tmp_path)[-1])
  text = compiled.as_text() or ""
  table = trace_kernels.kernel_table(events, text, calls=2, platform="cpu")
  names = trace_kernels.hlo_instruction_names(text)
  assert table["kernels"] and all(r["hlo"] and r["name"] in names for r in table["kernels"])
  assert table["seconds"] > 0 and table["unmapped_seconds"] == 0
  assert not trace_kernels.kernel_table(events, text, calls=2, platform="gpu")["kernels"]  # no GPU plane here


def _run_folder(tmp_path):
  """A folder as `calibrate run` and `gemm_sweep` leave it on a device (the fields collect reads)."""
  folder = tmp_path / "work"
  (folder / "programs" / "ffn_W3").mkdir(parents=True)
  (folder / "gemms").mkdir()
  meta = {"device": "h100", "device_kind": "NVIDIA H100 80GB HBM3", "jax": "0.11.2", "revision": "abc123"}
  (folder / "meta.json").write_text(json.dumps(meta | {"date": "d", "xla_flags": ""}))
  kernels = [{"name": "gemm_fusion_dot_general.8", "hlo": True, "seconds": 0.002, "count": 1.0, "kernel_names": ["k"]}]
  program = {"program": "ffn_W3", "recipe": "int8_rtne", "compile_s": 20.0, "step_seconds": 0.0108}
  program |= {"kernels": kernels, "kernel_seconds": 0.01, "gemms": []}
  (folder / "programs" / "ffn_W3" / "int8_rtne.json").write_text(json.dumps(program))
  (folder / "programs" / "ffn_W3" / "bf16.json").write_text(json.dumps({"program": "ffn_W3", "error": "x"}))
  row = {"dtype": "s8", "shape": "W3", "gemm": "dx", "m": 16384, "n": 2048, "k": 8192, "backend": "triton"}
  row |= {"tile": "128x128x64 w8 s3", "kernels": 1, "seconds": 0.001, "iqr_s": 1e-5}
  for tag, options in (("", {}), ("_cublas_s8", {"xla_gpu_enable_triton_gemm": False})):
    doc: dict = {
      "meta": {"xla_flags": "", "device_kind": meta["device_kind"]},
      "settings": {"compiler_options": options},
    }
    doc["results"] = [
      row | ({"backend": "cublaslt"} if tag else {}),
      {"dtype": "s8", "shape": "W3", "gemm": "dw", "error": "e"},
    ]
    (folder / "gemms" / f"bench_gemm_sweep{tag}_gpu.json").write_text(json.dumps(doc))
  return folder


def test_collect_writes_the_models_calibration_file_and_install_never_overwrites_one(tmp_path):
  folder = _run_folder(tmp_path)
  assert cli.main(["calibrate", "collect", str(folder)]) == 0
  found = json.loads((folder / "calibration.json").read_text())
  assert {"device", "device_kind", "jax", "revision", "date", "xla_flags", "gemms", "programs"} <= set(found)
  assert found["device"] == "h100" and found["revision"] == "abc123"
  (program,) = found["programs"]  # the failed program is left out
  assert program["program"] == "ffn_W3" and program["step_seconds"] == 0.0108
  assert program["kernels"] == [{"name": "gemm_fusion_dot_general.8", "seconds": 0.002, "count": 1.0, "hlo": True}]
  assert sorted((g["backend"], g["xla_flags"]) for g in found["gemms"]) == [
    ("cublaslt", "--xla_gpu_enable_triton_gemm=false"),
    ("triton", ""),
  ]
  keys = {"dtype", "m", "n", "k", "shape", "gemm", "seconds", "backend"}
  assert all(keys <= set(g) for g in found["gemms"])
  results = tmp_path / "results"
  assert cli.main(["calibrate", "install", str(folder), "--out-dir", str(results)]) == 0
  assert json.loads((results / "calibration_h100.json").read_text()) == found
  with pytest.raises(SystemExit, match="exists"):
    cli.main(["calibrate", "install", str(folder), "--out-dir", str(results)])
  assert cli.main(["calibrate", "install", str(folder / "calibration.json"), "--out-dir", str(results), "--force"]) == 0


def test_program_names_name_the_step_after_its_preset_and_depth_and_refuse_others():
  assert calibrate.program_names("ffn_W9,ffn_W3,step", "paper-12l", 2) == ["ffn_W9", "ffn_W3", "step_paper-12l_2l"]
  with pytest.raises(SystemExit, match="--programs moe"):
    calibrate.program_names("moe", "paper-12l", 2)
