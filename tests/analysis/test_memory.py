"""The buffer breakdown of a compiled program agrees with XLA's memory_analysis() and with itself."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from benchmarks import ffn
from labtools.analysis import memory

T, H, D = 64, 32, 96  # pairwise distinct, so a [T, D] buffer is unambiguous


def _args():
  f32, bf16 = jnp.float32, jnp.bfloat16
  shapes = [((T, H), bf16), ((H, D), f32), ((H, D), f32), ((D, H), f32), ((T, H), bf16)]
  return (*[jax.ShapeDtypeStruct(s, d) for s, d in shapes], jax.random.key(0))


@pytest.fixture(scope="module", params=["bf16", "int8_rtne"])
def found(request):
  b, compiled = memory.buffer_breakdown(ffn.make_fwd_bwd(request.param).lower(*_args()))
  return request.param, b, compiled.memory_analysis()


def test_temp_allocation_is_memory_analysis_temp(found):
  _, b, m = found
  assert b["temp_bytes"] == m.temp_size_in_bytes > 0


def test_temporaries_live_at_the_peak_are_disjoint_and_fit_the_temp_allocation(found):
  _, b, _ = found
  temps = sorted((p["offset"], p["offset"] + p["bytes"]) for p in b["peak"] if p["kind"] == "temp" and p["bytes"])
  assert temps, "no temporary live at the peak"
  assert all(end <= b["temp_bytes"] for _, end in temps)
  assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(temps, temps[1:]))  # live together: no overlap
  assert sum(e - s for s, e in temps) <= b["temp_bytes"]
  assert b["peak_live_bytes"] == sum(p["bytes"] for p in b["peak"])


def test_parameters_are_live_at_the_peak_with_their_sizes(found):
  _, b, m = found
  params = {p["buffer"].partition(".")[0]: p for p in b["peak"] if p["kind"] == "parameter" and p["dtype"] != "u32"}
  sizes = {"x": T * H * 2, "wg": H * D * 4, "wu": H * D * 4, "wd": D * H * 4, "dy": T * H * 2}
  assert {k: params[k]["bytes"] for k in sizes if k in params} == sizes
  assert sum(b["by_kind_dtype"]["parameter"].values()) <= m.argument_size_in_bytes


def test_int8_program_has_an_int32_gemm_output_of_the_ffn_width(found):
  recipe, b, _ = found
  s32 = [v for v in b["temp_values"] if v["type_text"].startswith(f"s32[{T},{D}]")]
  assert bool(s32) == (recipe == "int8_rtne")


def test_parsers_read_the_dump_formats():
  allocs, values = memory.parse_assignment(
    "BufferAssignment:\n"
    "allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n"
    " value: <1 x.1 @0> (size=64,offset=0): f32[16]{0}\n"
    "allocation 1: size 96, preallocated-temp:\n"
    " value: <2 fusion.3 @0> (size=64,offset=32): s32[4,4]{1,0}\n"
    " value: <3 cond.2.clone{0} (phi) @0> (size=32,offset=0): s8[4,8]{1,0}\n"
    "\nTotal bytes used: 160\n"
  )
  assert [a.kind for a in allocs.values()] == ["parameter", "temp"] and memory.temp_bytes(allocs) == 96
  assert [(v.name, v.allocation, v.offset) for v in values] == [("x.1{}", 0, 0), ("fusion.3{}", 1, 32),
                                                                ("cond.2.clone{0}", 1, 0)]  # fmt: skip
  step, live = memory.parse_peak("  Live ranges at 7 (peak):\n    fusion.3{}: 64 bytes (cumulative: 64 bytes)\n  Stack")
  assert (step, live) == (7, [("fusion.3{}", 64)])


def test_without_a_live_range_dump_the_temp_buffers_are_listed_once():
  assignment = (
    "allocation 0: size 96, preallocated-temp:\n"
    " value: <2 fusion.3 @0> (size=64,offset=32): s32[4,4]{1,0}\n"
    " value: <3 tuple.1{} @0> (size=64,offset=32): s32[4,4]{1,0}\n"
    " value: <4 fusion.4 @0> (size=32,offset=0): s8[4,8]{1,0}\n"
  )
  hlo_text = "ENTRY %main () -> s8[4,8] {\n  %fusion.3 = s32[4,4]{1,0} fusion(), kind=kLoop\n}\n"
  b = memory.breakdown(assignment, None, hlo_text)
  assert b["peak_step"] is None and [(p["buffer"], p["bytes"], p["dtype"]) for p in b["peak"]] == [
    ("fusion.3{}", 64, "s32"),
    ("fusion.4{}", 32, "s8"),
  ]
  assert b["peak"][0]["opcode"] == "fusion" and b["by_kind_dtype"] == {"temp": {"s32": 64, "s8": 32}}


def test_values_live_at_the_peak_in_the_same_memory_count_once():
  assignment = (
    "allocation 0: size 96, preallocated-temp:\n"
    " value: <2 fusion.3 @0> (size=64,offset=32): s32[4,4]{1,0}\n"
    " value: <3 arg_tuple.1{4} @0> (size=64,offset=32): s32[4,4]{1,0}\n"
    " value: <4 fusion.4 @0> (size=32,offset=0): s8[4,8]{1,0}\n"
  )
  live_range = (
    "  Live ranges at 3 (peak):\n    fusion.3{}: 64 bytes\n    arg_tuple.1{4}: 64 bytes\n"
    "    fusion.4{}: 32 bytes\n  Stack"
  )
  b = memory.breakdown(assignment, live_range, "ENTRY %main () -> s8[4,8] {\n}\n")
  assert b["peak_step"] == 3 and [p["buffer"] for p in b["peak"]] == ["fusion.3{}", "fusion.4{}"]
  assert b["peak_live_bytes"] == 96 == b["temp_bytes"]


def test_breakdown_compiles_for_real_when_the_persistent_cache_already_holds_the_program(tmp_path):
  """A hit in JAX's persistent compilation cache would skip XLA and its dump: the second breakdown
  of the same program, in a process whose cache holds it, still finds the buffer assignment."""
  import os
  import subprocess
  import sys

  code = (
    "import jax, jax.numpy as jnp\n"
    "from labtools.analysis import memory\n"
    "low = jax.jit(lambda a, b: jnp.tanh(a @ b) @ b.T).lower(jnp.ones((64, 32)), jnp.ones((32, 96)))\n"
    "low.compile()\n"  # written to the cache
    "b, _ = memory.buffer_breakdown(low)\n"
    "low.compile()\n"  # the cache is in use again afterwards
    "print(b['temp_bytes'] > 0)\n"
  )
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env["JAX_PLATFORMS"] = "cpu"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
  assert any(tmp_path.iterdir()), "the program was not written to the persistent cache"
