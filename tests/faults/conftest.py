"""Fault injection: the real `s3r` CLI in subprocesses on the `tiny` preset and a small corpus.

Every subprocess runs this checkout (cwd and PYTHONPATH at the repository root), sees an empty
data root ($S3R_DATA), shares one token cache and the suite's JAX compilation cache, so that each
case takes seconds. Refusals that end before any compile also run in this process
(`in_process=True`, `s3r.cli.main` with its output captured): the parametrized cases of one refusal
each keep one case in a subprocess, which also sees what a fresh process prints at start-up.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards judge boxing matches at night".split()
# A 6-step run: checkpoints at steps 4 and 6 (every 2, two kept), validation at 0, 3 and 6.
TINY = [
  "--preset",
  "tiny",
  "--steps",
  "6",
  "--batch",
  "2",
  "--seq",
  "32",
  "--vocab",
  "300",
  "--eval-every",
  "3",
  "--ckpt-every",
  "2",
  "--eval-batches",
  "1",
  "--no-progress",
]


def write_corpus(directory: pathlib.Path, n_docs: int = 60) -> pathlib.Path:
  rng = random.Random(0)
  directory.mkdir(parents=True, exist_ok=True)
  docs = [" ".join(rng.choice(WORDS) for _ in range(100)) + "." for _ in range(n_docs)]
  (directory / "docs.txt").write_text("\n\n\n".join(docs))
  return directory


def run_in_process(*args, cwd, env: dict | None = None, main=None, argv0=()) -> subprocess.CompletedProcess:
  """`s3r ARGS` as `s3r.cli.main` (or another command's `main`) in this process, in `cwd` with `env`
  set for the call, stdout and stderr captured: the exit code and output of the subprocess, without
  its start-up (importing JAX and s3r costs seconds per call)."""
  if main is None:
    from s3r.cli import main

  argv = [str(a) for a in args]
  out, err = io.StringIO(), io.StringIO()
  saved = dict(os.environ)
  os.environ.update(env or {})
  try:
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        code = main(argv)
      except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 1
  finally:
    os.environ.clear()
    os.environ.update(saved)
  return subprocess.CompletedProcess([*argv0, *argv], code, out.getvalue(), err.getvalue())


class Cli:
  """Runs `python -m s3r.cli ARGS` in a subprocess (Popen with start=True)."""

  def __init__(self, root: pathlib.Path):
    self.env = {
      **os.environ,
      "PYTHONPATH": str(REPO),
      "JAX_PLATFORMS": "cpu",
      "S3R_DATA": str(root / "empty-root"),
      "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    self.env["XLA_FLAGS"] = xla_flags()  # the suite's compile settings, no device count of the parent
    (root / "empty-root").mkdir(exist_ok=True)
    self.cache = root / "token-cache"
    self.corpus = write_corpus(root / "corpus")

  def argv(self, *args) -> list[str]:
    return [sys.executable, "-m", "s3r.cli", *map(str, args)]

  def __call__(self, *args, cwd=REPO, timeout: float = 240, in_process: bool = False) -> subprocess.CompletedProcess:
    if in_process:
      return self.here(*args, cwd=cwd)
    return subprocess.run(self.argv(*args), capture_output=True, text=True, cwd=cwd, env=self.env, timeout=timeout)

  def here(self, *args, cwd=REPO, main=None) -> subprocess.CompletedProcess:
    """`s3r ARGS` in this process with this runner's environment (see `run_in_process`)."""
    env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
    return run_in_process(*args, cwd=cwd, env=env, main=main, argv0=self.argv())

  def start(self, *args, cwd=REPO) -> subprocess.Popen:
    return subprocess.Popen(
      self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=self.env
    )

  def train(
    self, out, *extra, data=None, timeout: float = 240, in_process: bool = False
  ) -> subprocess.CompletedProcess:
    return self(*self.train_args(out, *extra, data=data), timeout=timeout, in_process=in_process)

  def train_args(self, out, *extra, data=None) -> list:
    return ["train", *TINY, "--data", data or self.corpus, "--cache-dir", self.cache, "--out", out, *extra]


@pytest.fixture(scope="session")
def cli(tmp_path_factory) -> Cli:
  return Cli(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="session")
def base_run(cli, tmp_path_factory) -> pathlib.Path:
  """A finished 6-step run (checkpoints 4 and 6); copy it with `run_copy` before changing it."""
  out = tmp_path_factory.mktemp("base") / "run"
  proc = cli.train(out)
  assert proc.returncode == 0, proc.stderr
  return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> pathlib.Path:
  out = tmp_path / "run"
  shutil.copytree(base_run, out)
  return out


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
  """The process exited with `code` and reported one error line (the last line of stderr) naming
  `fragments`, without a traceback; returns that line."""
  assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if "error:" in line]
  assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr[-3000:]
  for fragment in fragments:
    assert fragment in errors[0], errors[0]
  return errors[0]


def metrics_lines(out: pathlib.Path) -> list[str]:
  return (out / "metrics.jsonl").read_text().splitlines()


def snapshot(out: pathlib.Path) -> dict[str, bytes]:
  """Every file of a run directory but the lock, by relative path."""
  return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".lock"}


def wait_for_step(out: pathlib.Path, step: int, proc, timeout: float = 180) -> None:
  """Waits until the training `proc` writing into `out` has logged step `step` (it must stay alive)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    if (out / "metrics.jsonl").exists() and len(metrics_lines(out)) > step:
      return
    time.sleep(0.05)
  raise AssertionError(f"no step {step} within {timeout}s")
