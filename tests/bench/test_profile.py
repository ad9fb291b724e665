"""`python -m benchmarks profile` helpers: fusion descriptions and categories from a compiled FFN block."""

from __future__ import annotations

from benchmarks import ffn, profile
from labtools.analysis.hlo import hlo_text


def test_describe_fusions_finds_the_int8_gemms():
  t, h, d = 32, 64, 128
  inputs = ffn.make_inputs(t, h, d)
  text = hlo_text(ffn.make_fwd_bwd("s3r").lower(*inputs).compile())
  desc = profile.describe_fusions(text, {"weight": h * d, "t_d": t * d, "t_h": t * h})
  gemms = [v for v in desc.values() if v["category"] == "int8 GEMM"]
  assert len(gemms) >= 9  # 3 projections x (forward, dX, dW)
  assert all(v["shape"].startswith("s32") for v in gemms)
  assert any(v["category"] == "reduction" for v in desc.values())  # the scales and the step Δ
  assert any(v["category"] == "elementwise [T,D]" for v in desc.values())  # e.g. silu


def test_enable_traceme_sets_the_flag(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
  profile.enable_traceme()
  import os

  assert profile.TRACEME_FLAG in os.environ["XLA_FLAGS"] and "--xla_foo=1" in os.environ["XLA_FLAGS"]
