"""What the CLI says: `s3r eval` of one step, malformed meshes, the compile messages, and bad input that must be
refused in exactly one stderr line (no XLA log noise before it), for `s3r train` and `python -m benchmarks comm`.
The first eval runs in a fresh process; the other eval cases run `s3r.cli.main` in this one (conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.faults.conftest import REPO, assert_one_line_error


def _quiet_env(cli) -> dict:
  """The CLI's environment without TF_CPP_MIN_LOG_LEVEL, so that XLA's C++ logging would reach stderr."""
  return {k: v for k, v in cli.env.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _only_line(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
  """`proc` exited with `code` and its whole stderr is one error line naming `fragments`."""
  line = assert_one_line_error(proc, code, *fragments)
  assert proc.stderr == line + "\n", proc.stderr[-3000:]
  return line


@pytest.mark.parametrize("where", ["checkpoints/4", pytest.param("checkpoints/4/", marks=pytest.mark.slow)])
def test_eval_of_a_checkpoint_folder_evaluates_that_step(cli, base_run, where):
  proc = cli("eval", f"{base_run}/{where}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "eval: step 4 of" in proc.stdout and "val: loss" in proc.stdout


@pytest.mark.parametrize("where", ["", "checkpoints"])
def test_eval_step_flag_evaluates_that_step_of_a_run_or_checkpoints_folder(cli, base_run, where):
  proc = cli("eval", base_run / where, "--step", "4", in_process=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "eval: step 4 of" in proc.stdout


def test_eval_says_it_compiles_before_compiling_and_how_long_it_took(cli, base_run):
  proc = cli("eval", base_run, in_process=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  before = lines.index("compiling the eval step ...")
  assert any(line.startswith("compiled the eval step in ") for line in lines[before + 1 :]), proc.stdout


def test_eval_of_a_step_without_a_checkpoint_fails_in_one_line_listing_the_steps_there_are(cli, base_run):
  assert_one_line_error(
    cli("eval", base_run, "--step", "5", in_process=True), 2, "no checkpoint of step 5", "steps 4, 6"
  )


def test_eval_refuses_a_checkpoint_folder_and_a_different_step_flag(cli, base_run):
  proc = cli("eval", base_run / "checkpoints" / "6", "--step", "4", in_process=True)
  assert_one_line_error(proc, 2, "checkpoint of step 6", "--step 4")


def test_eval_of_a_damaged_step_fails_in_one_line_instead_of_falling_back(cli, run_copy):
  (run_copy / "checkpoints" / "6" / "meta" / "metadata").write_text("{not json")
  assert_one_line_error(
    cli("eval", run_copy, "--step", "6", in_process=True), 2, "the checkpoint of step 6 in", "is unreadable"
  )


def test_eval_cache_dir_reads_and_writes_the_token_cache_there_with_the_same_losses(cli, base_run, tmp_path):
  cache = tmp_path / "other-cache"
  default = cli("eval", base_run, "--step", "4", in_process=True)
  moved = cli("eval", base_run, "--step", "4", "--cache-dir", cache, in_process=True)
  assert moved.returncode == 0, moved.stderr[-3000:]
  assert any(cache.rglob("*")), "nothing was written into --cache-dir"
  losses = lambda proc: [line for line in proc.stdout.splitlines() if ": loss " in line]  # noqa: E731
  assert losses(moved) == losses(default) and losses(default)


def test_eval_refuses_a_cache_dir_that_is_a_file(cli, base_run, tmp_path):
  (tmp_path / "file").write_text("")
  proc = cli("eval", base_run, "--cache-dir", tmp_path / "file", in_process=True)
  assert_one_line_error(proc, 2, "--cache-dir", "is an existing file")


def test_eval_refuses_a_negative_step(cli, base_run):
  assert_one_line_error(cli("eval", base_run, "--step", "-1", in_process=True), 2, "--step must be an integer >= 0")


BAD_MESHES = [
  ("data=2,data=1", "axis data is given twice"),
  ("data=1,data=1", "axis data is given twice"),
  ("pipeline=1", "unknown axis 'pipeline'"),
  ("data=one", "the size of data must be an integer >= 1, got 'one'"),
  ("data=0", "the size of data must be an integer >= 1, got '0'"),
  ("data", "bad entry 'data'; expected AXIS=SIZE"),
]  # the first case in a subprocess, the others in this process (tests/faults/conftest.py)


@pytest.mark.parametrize("mesh, fragment", BAD_MESHES)
def test_a_malformed_mesh_is_refused_in_one_line_naming_the_flag(cli, tmp_path, mesh, fragment):
  proc = cli.train(tmp_path / "run", "--mesh", mesh, in_process=mesh != BAD_MESHES[0][0])
  _only_line(proc, 2, f"--mesh {mesh}: ", fragment)
  assert not (tmp_path / "run").exists()


def test_train_says_it_compiles_before_compiling_and_how_long_it_took(cli, tmp_path):
  proc = cli.train(tmp_path / "run", "--steps", "1", "--eval-every", "1", "--ckpt-every", "1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  for step in ("train", "eval"):  # the eval step compiles when first used (the step-0 validation)
    before = lines.index(f"compiling the {step} step ...")
    assert any(line.startswith(f"compiled the {step} step in ") for line in lines[before + 1 :]), proc.stdout


def test_a_sequence_whose_attention_cannot_fit_is_refused_before_compiling_in_exactly_one_line(cli, tmp_path):
  args = cli.train_args(tmp_path / "run", "--seq", "1000000")
  proc = subprocess.run(cli.argv(*args), capture_output=True, text=True, cwd=REPO, env=_quiet_env(cli), timeout=240)
  _only_line(proc, 3, "the train step needs more than", "attention scores", "seq 1000000", "lower --batch or --seq")
  assert "compiling" not in proc.stdout


def _comm(cli, *args, in_process: bool = False) -> subprocess.CompletedProcess:
  argv = ["comm", "--preset", "tiny", "--layers", "1", *args]
  if in_process:
    from benchmarks.cli import main

    return cli.here(*argv, main=main)
  argv = [sys.executable, "-m", "benchmarks", *argv]
  return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_quiet_env(cli), timeout=240)


BAD_COMM = [
  (["--meshes", "data=2,data=1"], ["--meshes data=2,data=1: axis data is given twice"]),
  (["--meshes", "data=x"], ["--meshes data=x: the size of data must be an integer >= 1"]),
  (["--meshes", "data=2;fsdp=4"], ["every mesh must use the same number of devices", "data=2 (2)", "fsdp=4 (4)"]),
  (["--meshes", "data=3"], ["--batch 128 must be divisible by data x expert x fsdp = 3 of the mesh data=3"]),
  (["--recipes", "s3r,fp4"], ["--recipes: unknown recipe(s) fp4"]),
  (["--seq", "100000000"], ["--seq must be <= "]),
  (["--preset", "huge"], ["--preset must be one of"]),
]  # the first case in a subprocess, the others in this process


@pytest.mark.parametrize("args, fragments", BAD_COMM)
def test_comm_refuses_bad_input_in_exactly_one_line_before_compiling(cli, tmp_path, args, fragments):
  proc = _comm(cli, *args, "--out", tmp_path / "comm", in_process=args != BAD_COMM[0][0])
  _only_line(proc, 2, "python -m benchmarks comm: error: ", *fragments)
  assert not list(tmp_path.iterdir())
