"""`python -m benchmarks step` runs real (tiny) training steps per recipe and configuration and writes its results."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks import cli, step
from s3r import model as s3r_model


def _run(tmp_path, *extra):
  args = cli.build_parser().parse_args(
    [
      "step",
      "--batch",
      "2",
      "--seq",
      "8",
      "--repeats",
      "1",
      "--warmup",
      "0",
      "--prime",
      "0",
      "--no-chart",
      "--out-dir",
      str(tmp_path),
      *extra,
    ]
  )
  assert args.func(args) == 0
  return args


def test_step_bench_times_a_real_training_step_of_the_tiny_preset(tmp_path):
  _run(tmp_path, "--preset", "tiny", "--recipes", "s3r_ec_dx")
  doc = json.loads((tmp_path / f"bench_step_{jax.default_backend()}.json").read_text())
  (config,) = doc["results"]["configs"]
  assert doc["complete"] and config["model"]["preset"] == "tiny"
  assert config["recipes"]["s3r_ec_dx"]["tokens_per_s"] > 0


def test_step_bench_grad_accum_times_the_trainers_step_over_microbatches_of_the_global_batch(tmp_path):
  _run(tmp_path, "--preset", "tiny", "--recipes", "s3r_ec_dx", "--grad-accum", "2", "--tag", "accum")
  doc = json.loads((tmp_path / f"bench_step_accum_{jax.default_backend()}.json").read_text())
  assert doc["settings"]["grad_accum"] == 2 and doc["results"]["grad_accum"] == 2
  assert "B=2, S=8 in 2 microbatches" in (tmp_path / f"bench_step_accum_{jax.default_backend()}.md").read_text()
  assert doc["results"]["configs"][0]["recipes"]["s3r_ec_dx"]["memory"]["temp"] > 0


@pytest.mark.slow
def test_step_bench_measures_each_depth_with_memory_and_extrapolates_to_full_depth(tmp_path):
  _run(
    tmp_path,
    "--preset",
    "qwen3-tiny",
    "--layers",
    "1,2",
    "--width",
    "32",
    "--recipes",
    "bf16,s3r",
    "--remat",
    "full",
    "--mesh",
    "data=1",
    "--tag",
    "t",
  )
  doc = json.loads((tmp_path / f"bench_step_t_{jax.default_backend()}.json").read_text())["results"]
  depths = [c["model"]["n_layers"] for c in doc["configs"]]
  assert depths == [1, 2] and doc["remat"] == "full"
  for c in doc["configs"]:
    assert c["model"]["d_model"] == 32 and c["model"]["remat"] and c["model"]["attention_impl"] == "xla"
    for row in c["recipes"].values():
      mem = row["memory"]
      assert mem["total"] == mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] > 0
    assert c["recipes"]["s3r"]["speedup_vs_bf16"] > 0 and "s3r_over_int8_rtne" not in c["checks"]
  extra = doc["extrapolation"]["qwen3-tiny"]
  assert extra["depths"] == [1, 2] and extra["full_n_layers"] == s3r_model.PRESETS["qwen3-tiny"].n_layers
  md = (tmp_path / f"bench_step_t_{jax.default_backend()}.md").read_text()
  assert "Table IV" in md and "qwen3-8b" in md  # the paper's column of the family sits beside ours


def test_step_bench_refuses_a_mesh_the_devices_do_not_match():
  args = cli.build_parser().parse_args(["step", "--preset", "tiny", "--mesh", f"data={jax.device_count() + 1}"])
  with pytest.raises(SystemExit, match="devices"):
    step.run(args)


def test_attention_option_resolves_per_platform_and_the_config_rejects_unknown_kernels():
  args = cli.build_parser().parse_args(["step", "--preset", "gemma3-tiny", "--attention", "auto"])
  cfg = step.model_config("gemma3-tiny", "bf16", args, layers=None)
  assert cfg.attention_impl == ("cudnn" if jax.default_backend() == "gpu" else "xla")
  with pytest.raises(ValueError, match="attention_impl"):
    s3r_model.preset("tiny", attention_impl="flash")
