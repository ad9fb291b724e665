"""Commands never overwrite the committed results by default: every results-writing command
writes under `runs/` unless it is pointed at `results/` explicitly, and the README's research
commands leave a clone's `git status` clean."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import cli as bench_cli
from experiments import protocol

REPO = pathlib.Path(__file__).resolve().parents[1]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
  return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _output_defaults(parser: argparse.ArgumentParser) -> list[str]:
  return [
    str(a.default) for a in parser._actions if a.dest in ("out", "out_dir", "results_dir") and a.default is not None
  ]


@pytest.mark.parametrize("name", list(bench_cli.COMMANDS))
def test_every_benchmark_writes_under_runs_by_default(name):
  sub = _subparsers(bench_cli.build_parser())[name]
  outs = _output_defaults(sub)
  if name != "merge":  # merge takes a required --out (the user names the joined file)
    assert outs, f"{name} has no output flag with a default"
  assert all(pathlib.PurePath(o).parts[0] == "runs" for o in outs), (name, outs)


def test_every_experiment_command_writes_under_runs_by_default():
  from experiments.__main__ import build_parser

  for name, sub in _subparsers(build_parser()).items():
    outs = _output_defaults(sub)
    assert all(pathlib.PurePath(o).parts[0] == "runs" for o in outs), (name, outs)
  assert pathlib.PurePath(protocol.SweepConfig().results_dir).parts[0] == "runs"


@pytest.mark.parametrize("module", ["evalsize", "mechanism", "section3"])
def test_experiment_modules_write_under_runs_by_default(module):
  source = (REPO / "experiments" / f"{module}.py").read_text()
  assert f'default="runs/results/{module}"' in source


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> pathlib.Path:
  dest = tmp_path_factory.mktemp("clone") / "s3r"
  subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(dest)], check=True, timeout=120)
  return dest


def _status(clone: pathlib.Path) -> str:
  return subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout


def _python(clone: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": str(clone)}
  return subprocess.run([sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=600)


def test_readme_sweep_plan_ignores_the_committed_summaries(clone):
  proc = _python(clone, "-m", "experiments", "sweep", "--config", "configs/table1.json", "--plan")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("sweep table1: 0 runs finished"), proc.stdout
  assert _status(clone) == ""


def test_a_benchmark_run_from_the_readme_leaves_the_clone_clean(clone):
  proc = _python(clone, "-m", "benchmarks", "matmul", "--shape", "16,32,32", "--recipes", "bf16,s3r", "--repeats", "1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert list((clone / "runs" / "results").glob("bench_matmul_*.json"))
  assert _status(clone) == ""  # runs/ is ignored; results/ untouched
