"""`python -m benchmarks ffn` end to end at a tiny shape (1 repeat); numbers are not checked, only structure."""

from __future__ import annotations

import json

import jax
import numpy as np

from benchmarks import cli, ffn, options


def test_ffn_bench_writes_json_md_png(tmp_path):
  args = cli.build_parser().parse_args(
    ["ffn", "--shapes", "64x128", "--tokens", "32", "--repeats", "1", "--warmup", "0", "--out-dir", str(tmp_path)]
  )
  assert args.func(args) == 0
  stem = tmp_path / f"bench_ffn_{jax.default_backend()}"
  doc = json.loads(stem.with_suffix(".json").read_text())
  (res,) = doc["results"]
  assert (res["shape"], res["hidden"], res["ffn_dim"], res["tokens"]) == ("64x128", 64, 128, 32)
  assert list(res["recipes"]) == list(options.BENCH_RECIPES)
  for name, row in res["recipes"].items():
    assert row["timing"]["repeats"] == 1 and row["timing"]["median_s"] > 0
    assert np.isfinite(row["speedup_vs_bf16"]) and np.isfinite(row["speedup_vs_int8_sr"])
    assert ("overhead_vs_s3r_pct" in row) == name.startswith("s3r_ec")
  assert res["recipes"]["bf16"]["speedup_vs_bf16"] == 1.0
  md = stem.with_suffix(".md").read_text()
  assert "speedup vs bf16" in md and "s3r_ec_dx" in md
  assert stem.with_suffix(".png").stat().st_size > 0


def test_ffn_gradients_have_the_block_shapes():
  inputs = ffn.make_inputs(16, 32, 64)
  grads = ffn.make_fwd_bwd("s3r_ec_dx")(*inputs)
  assert [g.shape for g in grads] == [(16, 32), (32, 64), (32, 64), (64, 32)]
  assert all(bool(np.all(np.isfinite(np.asarray(g, np.float32)))) for g in grads)
