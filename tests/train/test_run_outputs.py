"""What a run writes beside its losses: achieved TFLOP/s, TensorBoard events, W&B, the --profile trace; the
events and the trace hold each step once, across --resume too."""

import dataclasses
import json
import pathlib
import re
import shlex
import shutil

import numpy as np
import pytest

from s3r.model import ModelConfig
from s3r.train import flops, loop
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import profiling, report, tracking
from tests.faults.conftest import assert_one_line_error, run_in_process
from tests.train.conftest import tiny_config

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "training.md"


def docs_commands() -> list[str]:
  """The `s3r train` command lines of docs/training.md's code blocks marked as run by this module."""
  commands, fence, marked = [], None, False  # fence: the info string of the open code block, None outside one
  for line in DOCS.read_text().splitlines():
    if line.startswith("```"):
      fence = line[3:].strip() if fence is None else None
      marked = marked and fence is not None
    elif fence is None:
      marked = line == "<!-- run as written by tests/train/test_run_outputs.py -->"
    elif marked and re.match(r"^(\w+=\S+ )*s3r train ", line):
      commands.append(line)
  assert len(commands) == 2, commands  # the TensorBoard and profiling example, the W&B example
  return commands


def run_docs_command(command: str, cwd: pathlib.Path, corpus_dir) -> tuple[pathlib.Path, list[str]]:
  """Runs a docs command as written, in `cwd`, where the data root holds a small corpus as its `enwiki`
  (the default corpus); (the run folder, the lines it printed)."""
  root = cwd / "data-root"
  shutil.copytree(corpus_dir, root / "enwiki")
  words = shlex.split(command)
  at = words.index("s3r")
  env = dict(w.split("=", 1) for w in words[:at])
  args = words[at + 1 :]
  proc = run_in_process(*args, cwd=cwd, env={"S3R_DATA": str(root), **env})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return cwd / args[args.index("--out") + 1], proc.stdout.splitlines()


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, corpus_dir):
  """The run of docs/training.md's TensorBoard and profiling example: tiny, 8 steps, checkpoints at 4 and 8,
  steps 4-6 traced; (its config, the lines it printed)."""
  command = next(c for c in docs_commands() if "--profile" in c)
  out, lines = run_docs_command(command, tmp_path_factory.mktemp("docs"), corpus_dir)
  cfg = TrainConfig.from_dict(json.loads((out / "config.json").read_text())["train"])
  return dataclasses.replace(cfg, out=str(out)), lines


@pytest.fixture(scope="module")
def resumed_run(profiled_run, tmp_path_factory):
  """The profiled run resumed from step 4 (its step-8 checkpoint removed) with --profile 2:6; (config, log)."""
  cfg, _ = profiled_run
  copy = dataclasses.replace(cfg, out=str(tmp_path_factory.mktemp("resumed") / "run"), resume=True, profile="2:6")
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/8")
  lines: list[str] = []
  with pytest.MonkeyPatch.context() as env:
    env.setenv("S3R_DATA", str(pathlib.Path(cfg.out).parents[1] / "data-root"))
    loop.train(copy, log=lines.append)
  return copy, lines


def _events(run_dir) -> dict[str, list[tuple[int, float]]]:
  """(step, value) of every scalar of every event file in `run_dir`, read with TensorBoard's own reader."""
  accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator", reason="tensorboard")
  events = accumulator.EventAccumulator(str(run_dir), size_guidance={accumulator.SCALARS: 0})
  events.Reload()
  return {name: [(e.step, e.value) for e in events.Scalars(name)] for name in events.Tags()["scalars"]}


def _expected_events(run_dir) -> dict[str, list[tuple[int, float]]]:
  """What the events must hold: every number of metrics.jsonl but the wall time, at its step (as float32)."""
  expected: dict[str, list[tuple[int, float]]] = {}
  for r in report.read_metrics(pathlib.Path(run_dir) / report.METRICS_FILE):
    for key, value in r.items():
      if key not in ("step", "wall_s"):
        expected.setdefault(tracking.tag(key), []).append((r["step"], float(np.float32(value))))
  return expected


def test_tensorboard_events_hold_every_metric_of_metrics_jsonl_at_its_step(profiled_run):
  cfg, lines = profiled_run
  events = _events(cfg.out)
  assert events == _expected_events(cfg.out)
  assert {"train/loss", "train/lr", "train/grad_norm", "val/loss", "perf/tokens_per_s", "perf/step_time_s"} <= set(
    events
  )
  assert [step for step, _ in events["val/loss"]] == [0, 8]
  assert "tensorboard: runs/tiny (open with: tensorboard --logdir runs/tiny)" in lines  # as the docs say


def test_resumed_run_events_hold_each_step_once_and_equal_its_metrics(resumed_run):
  cfg, lines = resumed_run
  assert any(line.endswith("; the events of steps 0-4 rewritten from metrics.jsonl") for line in lines), lines
  events = _events(cfg.out)  # every event file of the folder
  assert events == _expected_events(cfg.out)
  assert [step for step, _ in events["train/loss"]] == list(range(9))
  assert len(list(pathlib.Path(cfg.out).glob(tracking.EVENTS_GLOB))) == 1


def test_without_tensorboardx_the_run_says_how_to_get_the_event_files(tmp_path, corpus_dir, cache_dir, monkeypatch):
  monkeypatch.setattr(tracking, "has_tensorboard_writer", lambda: False)
  lines: list[str] = []
  outputs = tracking.RunOutputs(
    tiny_config(tmp_path, corpus_dir, cache_dir), tmp_path, keep_until_step=-1, log=lines.append
  )
  outputs.write({"step": 0, "loss": 5.0})
  outputs.close()
  assert lines == ["tensorboard: not written (needs tensorboardX: pip install 's3r[tensorboard]')"]
  assert list(tmp_path.glob(tracking.EVENTS_GLOB)) == []


def test_no_tensorboard_writes_no_event_file_but_the_metrics(tmp_path, corpus_dir, cache_dir):
  cfg = tiny_config(tmp_path, corpus_dir, cache_dir, tensorboard=False)
  outputs = tracking.RunOutputs(cfg, tmp_path, keep_until_step=-1, log=print)
  outputs.write({"step": 0, "loss": 5.0, "lr": 0.0})
  outputs.close()
  assert list(tmp_path.glob(tracking.EVENTS_GLOB)) == []
  assert report.read_metrics(tmp_path / report.METRICS_FILE) == [{"step": 0, "loss": 5.0, "lr": 0.0}]


@pytest.fixture
def wandb_offline(monkeypatch):
  """The wandb module, offline and quiet; its service process is shut down after the test."""
  wandb = pytest.importorskip("wandb", reason="wandb is an optional extra (pip install 's3r[wandb]')")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  yield wandb
  wandb.teardown()


def test_wandb_offline_run_receives_each_step_once_and_a_resume_continues_it(
  tmp_path, corpus_dir, cache_dir, wandb_offline
):
  cfg = tiny_config(tmp_path, corpus_dir, cache_dir, wandb="s3r-test", tensorboard=False)
  summaries: list[dict] = []
  ids = []
  # a run that recorded steps 0-2, then its resume from a checkpoint of step 1: steps 2 and 3 again
  for keep_until, steps in ((-1, (0, 1, 2)), (1, (2, 3))):
    outputs = tracking.RunOutputs(cfg, tmp_path, keep_until_step=keep_until, log=print)
    assert outputs.wandb is not None
    for step in steps:
      outputs.write({"step": step, "loss": 5.0 - step + keep_until, "tokens_per_s": 100.0, "wall_s": 1.0})
      summaries.append({k: outputs.wandb.summary.get(k) for k in ("train/loss", "_step")})
    ids.append(outputs.wandb.id)
    outputs.close()
  assert ids[0] == ids[1] == (tmp_path / tracking.WANDB_ID_FILE).read_text()
  assert summaries == [
    {"train/loss": 4.0, "_step": 0},
    {"train/loss": 3.0, "_step": 1},
    {"train/loss": 2.0, "_step": 2},
    {"train/loss": None, "_step": None},  # step 2 again: not sent
    {"train/loss": 3.0, "_step": 3},
  ]
  wandb_offline.teardown()  # the service process writes the offline records: wait for it
  runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{ids[0]}/run-{ids[0]}.wandb"))
  assert runs and all(b"train/loss" in r.read_bytes() for r in runs)  # the offline records, for `wandb sync`
  assert [r["step"] for r in report.read_metrics(tmp_path / report.METRICS_FILE)] == [0, 1, 2, 3]


def test_docs_wandb_command_runs_offline_as_written(tmp_path, corpus_dir, wandb_offline):
  command = next(c for c in docs_commands() if "--wandb" in c)
  assert command.startswith("WANDB_MODE=offline ")
  out, lines = run_docs_command(command, tmp_path, corpus_dir)
  run_id = (out / tracking.WANDB_ID_FILE).read_text()
  wandb_offline.teardown()  # the service process writes the offline records: wait for it
  records = list((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
  assert records and b"perf/tflops_per_s_per_device" in records[0].read_bytes()
  assert any(line.startswith("wandb: project ") for line in lines), lines


def test_wandb_without_its_package_is_refused_before_the_run_naming_the_flag(
  tmp_path, corpus_dir, cache_dir, monkeypatch
):
  monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
  cfg = tiny_config(tmp_path / "run", corpus_dir, cache_dir, wandb="proj")
  with pytest.raises(ConfigError, match=r"^--wandb proj: the wandb package is not installed"):
    loop.train(cfg, log=print)
  assert not (tmp_path / "run").exists()


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
  assert profiling.traced_steps(traces[0]) == [4, 5, 6]
  # The compiled program's kernels ran inside the trace (no validation runs at steps 4-6: they are the train step's).
  assert any(name.endswith("_fusion") or "_fusion." in name for name in profiling.event_names(traces[0]))
  assert any(line.startswith("profile: tracing steps 4-6 into") for line in lines), lines
  assert f"profile: wrote runs/tiny/profile/{traces[0].relative_to(cfg.out + '/profile')}" in lines


def test_xprof_reads_the_trace_and_shows_the_train_steps_kernels(profiled_run):
  convert = pytest.importorskip(
    "xprof.convert.raw_to_tool_data", reason="XProf is not a dependency (pip install xprof)"
  )
  cfg, _ = profiled_run
  trace = [str(profiling.trace_files(f"{cfg.out}/{profiling.PROFILE_DIR}")[0])]
  assert {"trace_viewer@", "overview_page", "hlo_stats"} <= set(convert.xspace_to_tool_names(trace))
  data, _ = convert.xspace_to_tool_data(trace, "trace_viewer", {})
  names = {event.get("name") or "" for event in json.loads(data)["traceEvents"]}
  assert any(name.endswith("_fusion") for name in names)


def test_profile_on_resume_traces_only_the_steps_after_the_restored_one(resumed_run):
  cfg, lines = resumed_run  # resumed at step 4 with --profile 2:6
  traces = profiling.trace_files(f"{cfg.out}/{profiling.PROFILE_DIR}")
  assert [profiling.traced_steps(t) for t in traces] == [[4, 5, 6], [5, 6]]
  assert any(line.startswith("profile: tracing steps 5-6") for line in lines), lines


def test_each_of_several_processes_traces_into_a_folder_of_its_own(monkeypatch):
  assert profiling.run_folder("run") == pathlib.Path("run/profile")
  monkeypatch.setattr(profiling.jax, "process_count", lambda: 2)
  monkeypatch.setattr(profiling.jax, "process_index", lambda: 1)
  assert profiling.run_folder("run") == pathlib.Path("run/profile/process-1")


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
    tiny_config(tmp_path / "run", corpus_dir, cache_dir, profile=spec)


def test_cli_refuses_a_bad_profile_in_one_line(tmp_path):
  proc = run_in_process("train", "--preset", "tiny", "--steps", "4", "--profile", "4:2", "--out", "run", cwd=tmp_path)
  assert_one_line_error(proc, 2, "--profile", "4:2")
  assert not (tmp_path / "run").exists()


def test_train_flags_set_the_outputs_fields_and_may_change_on_resume():
  from s3r import cli
  from s3r.cli import train as cli_train
  from s3r.train.config import RESUMABLE_CHANGES

  argv = ["train", "--no-tensorboard", "--wandb", "proj", "--profile", "2:3", "--steps", "4", "--out", "x"]
  cfg = cli_train.train_config(cli.build_parser(argv).parse_args(argv))
  assert (cfg.tensorboard, cfg.wandb, cfg.profile) == (False, "proj", "2:3")
  defaults = cli_train.train_config(cli.build_parser(["train"]).parse_args(["train"]))
  assert (defaults.tensorboard, defaults.wandb, defaults.profile) == (True, None, None)
  assert {"tensorboard", "wandb", "profile"} <= set(RESUMABLE_CHANGES)
