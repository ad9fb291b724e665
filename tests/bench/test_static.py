"""Static costs: random words from the jaxpr and op counts from the compiled HLO."""
from __future__ import annotations

import math

import pytest

from s3r.bench import static

T, K, N = 64, 96, 128


@pytest.fixture(scope="module")
def layer():
  return {r: static.analyze_layer(r, T, K, N) for r in ("int8_rtne", "int8_sr", "s3r", "s3r_ec_dx")}


def test_random_words_independent_sr_vs_shared(layer):
  assert layer["int8_rtne"]["random"]["words"] == 0
  assert layer["int8_sr"]["random"]["words"] == 2 * T * N  # two full-size f32 uniform draws
  assert layer["s3r"]["random"]["words"] == math.ceil(T / 4)  # 7-bit thresholds, four per word
  assert layer["s3r_ec_dx"]["random"]["words"] == math.ceil(T / 4)
  assert layer["int8_sr"]["random"]["words"] > layer["s3r"]["random"]["words"]


def test_random_words_agree_with_quant_inspect(layer):
  import jax
  import jax.numpy as jnp
  from s3r.quant import inspect as qinspect
  args = (jnp.zeros((T, K), jnp.bfloat16), jnp.zeros((K, N)), jnp.zeros((T, N), jnp.bfloat16), jax.random.key(0))
  for r in ("int8_sr", "s3r"):
    assert qinspect.random_words(jax.make_jaxpr(static.layer_fwd_bwd(r))(*args)) == layer[r]["random"]["words"]


def test_op_counts_and_int8_bytes(layer):
  extra = {r: layer[r]["ops"]["ops_per_element"] - layer["int8_rtne"]["ops"]["ops_per_element"] for r in layer}
  assert extra["int8_sr"] > 50  # Threefry per element
  assert abs(extra["s3r"]) < 20  # shared thresholds: about the cost of RTNE
  assert extra["int8_sr"] > 5 * max(extra["s3r"], 1)
  assert extra["int8_sr"] > extra["s3r_ec_dx"] > extra["s3r"]
  assert layer["int8_sr"]["int8_gradient_bytes"] == 2 * T * N  # G' quantized twice
  for r in ("int8_rtne", "s3r", "s3r_ec_dx"):
    assert layer[r]["int8_gradient_bytes"] == T * N  # one Q shared by both products


def test_parse_hlo_trip_counts():
  text = """HloModule m

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %f = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %f)
}

%fused (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %m = f32[4,8]{1,0} multiply(%a, %a)
  ROOT %s = f32[4,8]{1,0} add(%m, %a)
}

%bcast (v: f32[4], a: f32[4,8]) -> f32[4,8] {
  %v = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%v)
  %b = f32[4,8]{1,0} broadcast(%e), dimensions={0}
  %a = f32[4,8]{1,0} parameter(1)
  ROOT %m = f32[4,8]{1,0} multiply(%a, %b)
}

ENTRY %main (x: f32[4,8], v: f32[4]) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %v = f32[4]{0} parameter(1)
  %w = (s32[], f32[4,8]{1,0}) while(%tup), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %n = f32[4,8]{1,0} negate(%x)
  ROOT %g = f32[4,8]{1,0} fusion(%v, %n), kind=kLoop, calls=%bcast
}
"""
  out = static.gradient_sized_ops(text, 32)
  # the per-row exponential is evaluated once per output element of its loop fusion
  assert out["by_opcode"] == {"add": 5, "exponential": 1, "multiply": 6, "negate": 1}
  assert out["ops_per_element"] == 13
  assert out["shape_only_ops_per_element"] == 12
  # the fusion output in the loop (5x), the negate, the broadcast-multiply fusion
  assert out["written_bytes"]["f32"] == 5 * 32 * 4 + 32 * 4 + 32 * 4
