"""Command-line options shared by the benchmarks: FFN shapes, tokens per shape, the recipes timed.

H is the model width, D_ffn the FFN hidden width, T the tokens of one call.
"""

from __future__ import annotations

import re

from labtools.paper import FFN_SHAPES

# Tokens per shape when --tokens is not given: the per-token cost of both the GEMMs (∝ H·D)
# and the quantizer (∝ D) is linear in T, so the ratios hardly depend on T once the GEMMs are
# efficient; fewer tokens keep the large shapes within a few seconds per call on a small CPU.
DEFAULT_TOKENS: dict[str, int] = {
  "W1": 2048, "W2": 2048, "W3": 2048, "W4": 1024, "W5": 1024, "W6": 1024, "W7": 512, "W8": 512, "W9": 256,
}  # fmt: skip

BENCH_RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")


def parse_shapes(value: str | None) -> dict[str, tuple[int, int]]:
  """Shape label -> (H, D_ffn) from 'W1,W3', 'all', or custom 'HxD' entries such as '256x1024'."""
  if value is None or value == "all":
    return dict(FFN_SHAPES)
  out = {}
  for item in (v.strip() for v in value.split(",") if v.strip()):
    if item in FFN_SHAPES:
      out[item] = FFN_SHAPES[item]
      continue
    m = re.fullmatch(r"(\d+)x(\d+)", item)
    if not m:
      raise SystemExit(f"unknown shape {item!r}: use W1..W9, 'all' or HxD (e.g. 256x1024)")
    out[item] = (int(m.group(1)), int(m.group(2)))
  return out


def tokens_for(shape: str, tokens: int | None) -> int:
  """--tokens if given, else the per-shape default (2048 for custom HxD shapes)."""
  return int(tokens) if tokens else DEFAULT_TOKENS.get(shape, 2048)
