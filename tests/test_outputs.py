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
from research import protocol

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
  from research.__main__ import build_parser

  for name, sub in _subparsers(build_parser()).items():
    outs = _output_defaults(sub)
    assert all(pathlib.PurePath(o).parts[0] == "runs" for o in outs), (name, outs)
  assert pathlib.PurePath(protocol.SweepConfig().results_dir).parts[0] == "runs"


@pytest.mark.parametrize("module", ["evalsize", "mechanism", "section3", "gate_dose", "bf16_seeds"])
def test_experiment_modules_write_under_runs_by_default(module):
  source = (REPO / "research" / f"{module}.py").read_text()
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
  proc = _python(clone, "-m", "research", "sweep", "--config", "research/configs/table1.json", "--plan")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("sweep table1: 0 runs finished"), proc.stdout
  assert _status(clone) == ""


def test_a_benchmark_run_from_the_readme_leaves_the_clone_clean(clone):
  proc = _python(clone, "-m", "benchmarks", "matmul", "--shape", "16,32,32", "--recipes", "bf16,s3r", "--repeats", "1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert list((clone / "runs" / "results").glob("bench_matmul_*.json"))
  assert _status(clone) == ""  # runs/ is ignored; results/ untouched


# The README's commands (the `s3r` command line, `python -m benchmarks`, `python -m research`), at tiny sizes.
# RUN is a 2-step training that the later commands resume, evaluate and diagnose; CORPUS is a
# corpus outside the clone. Each must leave the clone's `git status` clean.
TINY_RUN = ["--preset", "tiny", "--batch", "2", "--seq", "32", "--vocab", "300", "--eval-batches", "1", "--no-progress"]
README_COMMANDS = {
  "train": ["-m", "s3r.cli", "train", "--recipe", "s3r_ec_dx", "--steps", "2", "--data", "CORPUS", "--out", "RUN"]
  + TINY_RUN,
  "resume": ["-m", "s3r.cli", "train", "--out", "RUN", "--resume", "--steps", "3", "--no-progress"],
  "eval": ["-m", "s3r.cli", "eval", "RUN", "--data", "CORPUS", "--eval-batches", "1"],
  "export": ["-m", "s3r.cli", "export", "RUN", "--out", "runs/export"],
  "generate": ["-m", "s3r.cli", "generate", "RUN", "--prompt", "Once upon a time", "--max-new-tokens", "2"],
  "recipes": ["-m", "s3r.cli", "recipes"],
  "models": ["-m", "s3r.cli", "models", "--json"],
  "bench-ffn": ["-m", "benchmarks", "ffn", "--shapes", "64x128", "--tokens", "32", "--repeats", "1", "--warmup", "0"],
  "bench-moe": ["-m", "benchmarks", "moe", "--shapes", "32x4x2x16+1", "--tokens", "16", "--repeats", "1"]
  + ["--warmup", "0", "--prime", "0", "--recipes", "bf16,s3r_ec_dx"],
  "bench-quantizer": ["-m", "benchmarks", "quantizer", "--shapes", "64x128", "--tokens", "32", "--repeats", "1"]
  + ["--number", "1"],
  "bench-static": ["-m", "benchmarks", "static", "--tokens", "24", "--k", "32", "--n", "40", "--memory-shapes", "none"],
  "bench-peers": ["-m", "benchmarks", "peers", "--shapes", "64x128", "--tokens", "32", "--ours", "s3r_ec_dx"]
  + ["--timed-ours", "s3r_ec_dx", "--repeats", "1", "--warmup", "0", "--keys", "1"],  # absent peers are skipped
  "bench-step": ["-m", "benchmarks", "step", "--preset", "tiny", "--batch", "2", "--seq", "8", "--repeats", "1"]
  + ["--warmup", "0", "--recipes", "bf16,s3r_ec_dx"],
  "bench-eqx": ["-m", "benchmarks", "eqx", "--recipes", "int8_rtne", "--batch", "2", "--seq", "8", "--dim", "16"]
  + ["--heads", "2", "--layers", "1", "--vocab", "32", "--repeats", "1", "--warmup", "0"],
  "bench-hf_load": ["-m", "benchmarks", "hf_load", "--preset", "llama-tiny", "--layers", "1", "--repeats", "1"],
  "bench-profile": ["-m", "benchmarks", "profile", "--shape", "64x128", "--tokens", "32", "--iters", "1"],
  "bench-comm": ["-m", "benchmarks", "comm", "--preset", "tiny", "--meshes", "data=2", "--recipes", "s3r"],
  "diagnose": ["-m", "research", "diagnose", "RUN", "--keys", "2", "--recipes", "int8_sr,s3r"],
  "benchmarks-help": ["-m", "benchmarks", "--help"],
  "research-help": ["-m", "research", "--help"],
  "family-train": ["-m", "s3r.cli", "train", "--preset", "qwen3-tiny", "--steps", "2", "--batch", "2", "--seq", "32"]
  + ["--vocab", "300", "--eval-batches", "1", "--data", "CORPUS", "--out", "runs/qwen3-tiny", "--no-progress"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
  from tests.faults.conftest import write_corpus

  return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(README_COMMANDS))
def test_readme_commands_at_tiny_sizes_leave_the_clone_clean(clone, corpus, name):
  argv = [{"CORPUS": str(corpus), "RUN": "runs/NAME"}.get(a, a) for a in README_COMMANDS[name]]
  proc = _python(clone, *argv)
  assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
  assert _status(clone) == "", f"{name} changed the clone:\n{_status(clone)}"


def test_the_readme_lists_the_commands_this_module_runs():
  """Every `s3r` sub-command and `python -m` entry point of the README's command line has an entry above."""
  import re

  readme = (REPO / "README.md").read_text()
  match = re.search(r"^## Command line\n(.*?)(?=^## )", readme, flags=re.S | re.M)
  assert match, "the README has no '## Command line' section"
  section = match.group(1)
  subs = set(re.findall(r"(?:^|; )s3r (\w+)", section, flags=re.M))
  assert {"train", "eval", "export", "generate", "recipes", "models"} <= subs, subs
  assert not subs - set(README_COMMANDS), subs - set(README_COMMANDS)
  assert "--resume" in section and "resume" in README_COMMANDS
  for entry in ("benchmarks", "research"):
    assert f"`python -m {entry} --help`" in section and f"{entry}-help" in README_COMMANDS, entry
