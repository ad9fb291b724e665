"""`s3r bench step` runs a real (tiny) training step per recipe and writes its results."""
from __future__ import annotations

import json

import jax
import pytest

from s3r.bench import cli, step


@pytest.mark.skipif(step.available() is not None, reason="s3r.model / s3r.train not available")
def test_step_bench_tiny(tmp_path):
  args = cli.build_parser().parse_args(["step", "--preset", "tiny", "--recipes", "s3r_ec_dx", "--batch", "2",
                                        "--seq", "16", "--repeats", "1", "--warmup", "0", "--out-dir", str(tmp_path)])
  assert args.func(args) == 0
  doc = json.loads((tmp_path / f"bench_step_{jax.default_backend()}.json").read_text())["results"]
  assert doc["preset"] == "tiny" and doc["recipes"]["s3r_ec_dx"]["tokens_per_s"] > 0
