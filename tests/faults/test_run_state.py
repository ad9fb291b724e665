"""Faults of a run directory: damaged checkpoints, a numerical fault, Ctrl-C, two trainings at once, SIGKILL."""

from __future__ import annotations

import json
import pathlib
import shutil
import signal

import pytest

from tests.faults.conftest import assert_one_line_error, metrics_lines, snapshot, wait_for_step

STEADY = ("step", "loss", "grad_norm", "lr", "val_loss")  # what a rerun must reproduce bit for bit


def _steady(lines: list[str]) -> list[dict]:
  return [{k: r.get(k) for k in STEADY} for r in map(json.loads, lines)]


def _damage(step_dir: pathlib.Path, how: str) -> None:
  if how == "truncated-state":
    for f in (step_dir / "state").rglob("*"):
      if f.is_file() and f.parent.name == "d":
        f.write_bytes(f.read_bytes()[:10])
  elif how == "deleted-state":
    shutil.rmtree(step_dir / "state")
  elif how == "garbled-meta":
    (step_dir / "meta" / "metadata").write_text("{not json")
  elif how == "missing-meta":
    shutil.rmtree(step_dir / "meta")


# what a resume prints on stdout, line by line (the library logs go to <out>/train.log)
RUN_LINES = (
  "data:",
  "tokenizer:",
  "tokens:",
  "checkpoint:",
  "resume:",
  "compiling",
  "compiled",
  "model:",
  "model FLOPs:",
  "tensorboard:",
  "step ",
  "final",
  "loss",
)


def test_resume_falls_back_past_a_truncated_latest_checkpoint_quietly_says_so_and_reproduces_the_run(
  cli, run_copy, base_run
):
  _damage(run_copy / "checkpoints" / "6", "truncated-state")
  proc = cli("train", "--out", run_copy, "--resume", "--no-progress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "checkpoint: using step 4" in proc.stdout and "unreadable" in proc.stdout
  assert _steady(metrics_lines(run_copy)) == _steady(metrics_lines(base_run))
  assert "Traceback" not in proc.stdout + proc.stderr and len(proc.stderr.splitlines()) <= 2, proc.stderr[-3000:]
  assert [line for line in proc.stdout.splitlines() if not line.startswith(RUN_LINES)] == [], proc.stdout
  detail = (run_copy / "train.log").read_text()  # the detail is kept there: s3r's record with the traceback
  assert "checkpoint step 6 of" in detail and "is unreadable" in detail and "Traceback" in detail


@pytest.mark.parametrize(
  "how", ["deleted-state", *(pytest.param(h, marks=pytest.mark.slow) for h in ("garbled-meta", "missing-meta"))]
)  # eval and resume share the fallback (Checkpointer._newest_readable); resume reads past a garbled meta too
def test_eval_falls_back_past_a_damaged_latest_checkpoint_and_says_so(cli, run_copy, how):
  _damage(run_copy / "checkpoints" / "6", how)
  proc = cli("eval", run_copy)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "checkpoint: using step 4" in proc.stdout and "eval: step 4" in proc.stdout
  assert "Traceback" not in proc.stderr


def test_eval_with_every_checkpoint_damaged_fails_in_one_line(cli, run_copy):
  for step in (4, 6):
    _damage(run_copy / "checkpoints" / str(step), "garbled-meta")
  assert_one_line_error(cli("eval", run_copy), 2, "no readable checkpoint")


# A truncated array file makes tensorstore report "Event loop is closed" from its callbacks, one traceback
# per pending chunk, through sys.unraisablehook: those go to the run's train.log, never to the console.
@pytest.mark.parametrize("command", ["eval", "generate"])
def test_a_truncated_newest_checkpoint_is_skipped_with_only_the_documented_lines(cli, run_copy, command):
  _damage(run_copy / "checkpoints" / "6", "truncated-state")
  args = ("--prompt", "the", "--max-new-tokens", "2") if command == "generate" else ()
  proc = cli(command, run_copy, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr == "", proc.stderr[-3000:]
  assert "Traceback" not in proc.stdout and "Event loop" not in proc.stdout, proc.stdout
  if command == "eval":
    assert "checkpoint: using step 4" in proc.stdout


@pytest.mark.parametrize("command", ["eval", "generate", "export"])
def test_every_checkpoint_truncated_fails_in_one_line_with_the_detail_in_the_runs_log(cli, run_copy, tmp_path, command):
  for step in (4, 6):
    _damage(run_copy / "checkpoints" / str(step), "truncated-state")
  args = {"eval": (), "generate": ("--prompt", "the"), "export": ("--out", tmp_path / "hf")}[command]
  proc = cli(command, run_copy, *args)
  line = assert_one_line_error(proc, 2, "no readable checkpoint")
  assert proc.stderr == line + "\n" and proc.stdout == "", proc.stderr[-3000:]
  # the detail goes to the run's log; tensorstore's "Event loop is closed" tracebacks, when its pending
  # callbacks outlive the loop (timing-dependent: not on every run), go there too and never to the console
  detail = (run_copy / "train.log").read_text()
  assert "checkpoint step 6 of" in detail and "checkpoint step 4 of" in detail and "Traceback" in detail


def test_a_non_finite_loss_stops_with_exit_1_naming_the_checkpoint_and_keeps_metrics_and_plot(cli, run_copy):
  import jax
  import numpy as np

  from s3r.train import loop
  from s3r.train.config import TrainConfig
  from s3r.train.run import checkpoint

  shutil.rmtree(run_copy / "checkpoints" / "6")
  ckpt = checkpoint.Checkpointer(run_copy / "checkpoints", create=False)
  meta = ckpt.read_meta(4)
  cfg = TrainConfig.from_dict(meta["train_config"])
  setup = loop.build(cfg, len(json.loads(meta["tokenizer"])["model"]["vocab"]), loop.make_mesh(cfg))
  state, meta = ckpt.restore(setup.abstract_state, 4)
  ckpt.save(4, state._replace(params=jax.tree.map(lambda x: x * np.nan, state.params)), meta)
  ckpt.close()
  (run_copy / "loss.png").unlink()
  kept = metrics_lines(run_copy)[:5]
  proc = cli("train", "--out", run_copy, "--resume")
  line = assert_one_line_error(proc, 1, "non-finite loss at step 5", str(run_copy / "checkpoints" / "4"))
  assert "first non-finite gradient: " in line  # the guard names the parameter whose gradient went first
  assert metrics_lines(run_copy) == kept and (run_copy / "loss.png").exists()


def test_a_second_training_on_the_same_out_is_refused_and_ctrl_c_saves_and_exits_cleanly(cli, tmp_path):
  out = tmp_path / "run"
  first = cli.start(*cli.train_args(out, "--steps", "100000", "--ckpt-every", "50000", "--eval-every", "50000"))
  try:
    wait_for_step(out, 3, first)
    second = cli("train", "--out", out, "--resume")
    assert_one_line_error(second, 2, "another training is running on", f"pid {first.pid}")
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
  finally:
    first.kill()
  assert first.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("s3r: error: interrupted: SIGINT")
  step = len(metrics_lines(out)) - 1
  assert (out / "checkpoints" / str(step)).is_dir() and (out / "loss.png").exists()
  assert f"checkpoints/{step}" in stderr and "--resume" in stderr


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_reproduces_the_uninterrupted_metrics(cli, tmp_path):
  args = ["--steps", "600", "--ckpt-every", "50", "--eval-every", "200"]
  reference = cli.train(tmp_path / "reference", *args)
  assert reference.returncode == 0, reference.stderr[-3000:]
  out = tmp_path / "run"
  proc = cli.start(*cli.train_args(out, *args))
  try:
    wait_for_step(out, 120, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    proc.kill()
  killed_at = len(metrics_lines(out)) - 1
  assert killed_at < 600, "the run finished before it was killed"
  before = snapshot(out / "checkpoints")
  resumed = cli("train", "--out", out, "--resume")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _steady(metrics_lines(out)) == _steady(metrics_lines(tmp_path / "reference"))
  assert before  # the checkpoints written before the kill were there to resume from
