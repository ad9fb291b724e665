"""What a run writes beside its losses: achieved TFLOP/s, the --profile trace (once, and across --resume)."""

import dataclasses
import json
import shutil
from typing import Any

import pytest

from s3r.model import ModelConfig
from s3r.train import flops, loop, profiling
from s3r.train.config import ConfigError, TrainConfig
from tests.faults.conftest import assert_one_line_error, run_in_process


def _config(out, corpus_dir, cache_dir, **overrides) -> TrainConfig:
  fields: dict[str, Any] = dict(
    out=str(out),
    preset="tiny",
    recipe="s3r_ec_dx",
    steps=6,
    warmup=2,
    batch=4,
    seq=32,
    lr=3e-3,
    data=str(corpus_dir),
    vocab=300,
    cache_dir=str(cache_dir),
    eval_every=3,
    eval_batches=1,
    ckpt_every=3,
    progress=False,
  )
  return TrainConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, corpus_dir, cache_dir):
  """A 6-step tiny run that traces steps 2 and 3; (config, its log lines)."""
  cfg = _config(tmp_path_factory.mktemp("profiled") / "run", corpus_dir, cache_dir, profile="2:3")
  lines: list[str] = []
  loop.train(cfg, log=lines.append)
  return cfg, lines


def test_every_step_records_its_achieved_tflops_from_the_model_flops_and_cpu_has_no_mfu(profiled_run):
  cfg, lines = profiled_run
  records = [json.loads(line) for line in open(f"{cfg.out}/metrics.jsonl")]
  model = ModelConfig.from_dict(json.load(open(f"{cfg.out}/config.json"))["model"])
  per_token = flops.train_flops_per_token(model, cfg.seq_len)
  for r in records[1:]:
    assert r["tflops_per_s_per_device"] == pytest.approx(per_token.per_token * r["tokens_per_s"] / 1e12, rel=1e-12)
    assert "mfu" not in r  # no bf16 peak for a CPU
  assert any(line.startswith("model FLOPs: ") and "no MFU" in line for line in lines), lines


def test_profile_traces_exactly_the_asked_steps_with_the_train_steps_kernels(profiled_run):
  cfg, lines = profiled_run
  traces = profiling.trace_files(f"{cfg.out}/{profiling.PROFILE_DIR}")
  assert len(traces) == 1
  assert profiling.traced_steps(traces[0]) == [2, 3]
  # The compiled program's kernels ran inside the trace (no validation runs at steps 2-3: they are the train step's).
  assert any(name.endswith("_fusion") or "_fusion." in name for name in profiling.event_names(traces[0]))
  assert any(line.startswith("profile: tracing steps 2-3 into") for line in lines), lines
  assert f"profile: wrote {traces[0]}" in lines


def test_profile_on_resume_traces_only_the_steps_after_the_restored_one(profiled_run, tmp_path):
  cfg, _ = profiled_run
  copy = dataclasses.replace(cfg, out=str(tmp_path / "copy"), resume=True, profile="2:5")
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/6")
  lines: list[str] = []
  loop.train(copy, log=lines.append)  # resumes at step 3
  traces = profiling.trace_files(f"{copy.out}/{profiling.PROFILE_DIR}")
  assert [profiling.traced_steps(t) for t in traces] == [[2, 3], [4, 5]]
  assert any(line.startswith("profile: tracing steps 4-5") for line in lines), lines


def test_profile_of_steps_before_the_restored_one_traces_nothing_and_says_so(tmp_path):
  steps = profiling.StepProfiler(tmp_path, (2, 3), resumed_at=3)
  for step in (4, 5):
    with steps.step(step):
      pass
  assert not steps.planned and profiling.trace_files(tmp_path) == []
  assert steps.describe() == "profile: nothing to trace (the run is past step 3)"


@pytest.mark.parametrize("spec", ["3", "a:b", "0:2", "5:2", "2:7", "-1:2"])
def test_bad_profile_steps_are_refused_naming_the_flag(spec, tmp_path, corpus_dir, cache_dir):
  with pytest.raises(ConfigError, match=r"^--profile .*\(TrainConfig.profile\)$"):
    _config(tmp_path / "run", corpus_dir, cache_dir, profile=spec)


def test_cli_refuses_a_bad_profile_in_one_line(tmp_path):
  proc = run_in_process("train", "--preset", "tiny", "--steps", "4", "--profile", "4:2", "--out", "run", cwd=tmp_path)
  assert_one_line_error(proc, 2, "--profile", "4:2")
  assert not (tmp_path / "run").exists()
