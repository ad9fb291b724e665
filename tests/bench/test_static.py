"""Static costs: random words from the jaxpr and op counts from the compiled HLO."""

from __future__ import annotations

import math

import pytest

from benchmarks import static

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


def test_op_counts_and_int8_bytes(layer):
  extra = {r: layer[r]["ops"]["ops_per_element"] - layer["int8_rtne"]["ops"]["ops_per_element"] for r in layer}
  assert extra["int8_sr"] > 50  # Threefry per element
  assert abs(extra["s3r"]) < 20  # shared thresholds: about the cost of RTNE
  assert extra["int8_sr"] > 5 * max(extra["s3r"], 1)
  assert extra["int8_sr"] > extra["s3r_ec_dx"] > extra["s3r"]
  assert layer["int8_sr"]["int8_gradient_bytes"] == 2 * T * N  # G' quantized twice
  for r in ("int8_rtne", "s3r", "s3r_ec_dx"):
    assert layer[r]["int8_gradient_bytes"] == T * N  # one Q shared by both products


def test_memory_breakdown_of_the_ffn_matches_its_memory_analysis():
  m = static.ffn_memory("int8_rtne", 48, 32, 80, breakdown=True)
  assert m is not None  # compiled on this backend
  b = m["breakdown"]
  assert b["temp_bytes"] == m["temp_size_in_bytes"] and 0 < len(b["peak"]) <= static.BREAKDOWN_ROWS
  text = "\n".join(static.breakdown_markdown([{"shape": "32x80", "hidden": 32, "ffn_dim": 80, "tokens": 48,
                                               "recipes": {"int8_rtne": m}}], ["int8_rtne"]))  # fmt: skip
  assert f"| int8_rtne | {m['temp_size_in_bytes'] / 2**20:.1f} |" in text
