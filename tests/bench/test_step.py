"""`s3r bench step` runs a real (tiny) training step per recipe and writes its results."""

from __future__ import annotations

import json

import jax

from s3r.bench import cli


def test_step_bench_times_a_real_training_step_of_the_tiny_preset(tmp_path):
  args = cli.build_parser().parse_args(
    [
      "step",
      "--preset",
      "tiny",
      "--recipes",
      "s3r_ec_dx",
      "--batch",
      "2",
      "--seq",
      "16",
      "--repeats",
      "1",
      "--warmup",
      "0",
      "--out-dir",
      str(tmp_path),
    ]
  )
  assert args.func(args) == 0
  doc = json.loads((tmp_path / f"bench_step_{jax.default_backend()}.json").read_text())["results"]
  assert doc["preset"] == "tiny" and doc["recipes"]["s3r_ec_dx"]["tokens_per_s"] > 0
