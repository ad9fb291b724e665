"""The `s3r` command line: recipes, train end to end on `tiny`, resume alone, eval from elsewhere, help texts and
one-line errors (the fault-injection suite in tests/faults covers the failure cases)."""

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from s3r import cli
from s3r.cli import common as cli_common
from s3r.cli import train as cli_train
from s3r.quant import RECIPES
from s3r.quant.formats import FORMATS
from tests.faults.conftest import run_in_process


def _corpus(directory: pathlib.Path) -> pathlib.Path:
  rng = random.Random(1)
  words = "a small corpus of plain text files for the command line test of the trainer".split()
  directory.mkdir()
  for i in range(3):
    docs = [" ".join(rng.choice(words) for _ in range(120)) + "." for _ in range(40)]
    (directory / f"file{i}.txt").write_text("\n\n\n".join(docs))
  return directory


def test_recipes_lists_every_recipe_with_its_description(capsys):
  assert cli.main(["recipes"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == len(RECIPES) + 2
  for line, (name, recipe) in zip(lines, RECIPES.items()):
    assert line.split()[0] == name and line.endswith(recipe.description)
  assert lines[-2].startswith("gradient formats") and all(f in lines[-2] for f in FORMATS)
  assert lines[-1].startswith("forward formats") and "int8, e4m3" in lines[-1]


@pytest.mark.parametrize("argv, level", [(["train", "--help"], "2"), (["train", "--verbose", "--help"], None)])
def test_xla_warnings_stay_off_the_console_unless_verbose(monkeypatch, capsys, argv, level):
  """XLA's C++ log lines bypass Python logging: main() quiets them (before JAX loads) unless --verbose."""
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
  with pytest.raises(SystemExit):
    cli.main(argv)
  assert os.environ.get("TF_CPP_MIN_LOG_LEVEL") == level


def test_train_on_tiny_runs_end_to_end_resumes_alone_and_eval_finds_the_cache_from_elsewhere(
  tmp_path, capsys, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  _corpus(tmp_path / "data")
  argv = [
    "train",
    "--preset",
    "tiny",
    "--recipe",
    "s3r",
    "--steps",
    "6",
    "--batch",
    "4",
    "--seq",
    "32",
    "--vocab",
    "300",
    "--data",
    "data",
    "--out",
    "run",
    "--eval-every",
    "3",
    "--ckpt-every",
    "3",
    "--eval-batches",
    "2",
    "--cache-dir",
    "cache",
    "--no-progress",
  ]
  assert cli.main(argv) == 0
  out = tmp_path / "run"
  printed = capsys.readouterr().out
  assert "final validation loss (step 6): val_loss" in printed and "run/loss.png" in printed
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(0, 7)) and "val_loss" in records[-1]
  assert (out / "loss.png").stat().st_size > 0 and (out / "checkpoints" / "6").is_dir()
  saved = json.loads((out / "config.json").read_text())["train"]
  assert saved["warmup"] == 0 and saved["cache_dir"] == str(tmp_path / "cache")  # min(30, 6 // 10); absolute

  # `--resume` alone keeps the run's settings; a larger --steps extends it.
  assert cli.main(["train", "--out", "run", "--resume", "--steps", "8", "--no-progress"]) == 0
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(0, 9))
  assert json.loads((out / "config.json").read_text())["train"] == {**saved, "steps": 8, "resume": True}
  capsys.readouterr()

  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")
  assert cli.main(["eval", str(out), "--eval-batches", "2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  val = next(line for line in lines if line.startswith("val:"))
  assert f"loss {records[-1]['val_loss']:.4f}" in val and "perplexity" in val
  assert any(line.startswith("tokens: cached val") for line in lines)  # the run's cache, found from elsewhere
  assert not (tmp_path / "elsewhere" / "cache").exists()


@pytest.mark.parametrize(
  "text",
  [
    "exit codes: 0 ok, 1 training diverged, 2 bad input",
    "3 not enough memory",
    "130 interrupted",
    "--resume",
    "stretched",
    "$S3R_DATA",
    "../shared/data beside the repository",
    "python-stdlib",
    "needs no data",
    "tiny: vocab 512, seq 128",
    "min(30, steps // 10)",
  ],
)
def test_train_help_documents_exit_codes_resume_data_lookup_and_presets(capsys, text):
  with pytest.raises(SystemExit):
    cli.main(["train", "--help"])
  assert text in " ".join(capsys.readouterr().out.split())


def _run_cli(*args, cwd):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "s3r.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
  )


BAD_INPUT = [
  (["train", "--data", "does/not/exist", "--preset", "tiny", "--out", "run"], "does not exist"),
  (["train", "--steps", "-3", "--out", "run"], "--steps must be an integer >= 1"),
  (["train", "--steps", "20", "--warmup", "30", "--out", "run"], "--warmup must be an integer in [0, --steps=20]"),
  (["train", "--recipe", "fp4", "--out", "run"], "invalid choice"),
  (["train", "--recipe", "bf16@int4", "--out", "run"], "'bf16' does not quantize the gradient"),
  (["train", "--mesh", "data=3", "--out", "run"], "--mesh"),
  (["eval", "no/such/run"], "no checkpoint"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_exits_2_with_one_error_line_and_no_traceback(tmp_path, args, message):
  if args == BAD_INPUT[0][0]:  # one case in a fresh process: nothing else reaches stderr at start-up
    proc = _run_cli(*args, cwd=tmp_path)
  else:
    proc = run_in_process(*args, cwd=tmp_path)  # the same command as cli.main in this process
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0] and "error" in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr


def _raise(error):
  def run(args):
    raise error

  return run


@pytest.mark.parametrize(
  "error, code, text",
  [
    (
      RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 92.00GiB.\nmore detail"),
      3,
      "out of device memory (RESOURCE_EXHAUSTED: Out of memory while trying to allocate 92.00GiB.)",
    ),
    (MemoryError(), 3, "out of host memory"),
    (OSError(28, "No space left on device", "/runs/x/metrics.jsonl"), 3, "No space left on device: /runs/x"),
    (PermissionError(13, "Permission denied", "/cache/tokens"), 2, "Permission denied: /cache/tokens"),
    (KeyboardInterrupt(), 130, "interrupted before training started"),
  ],
)
def test_expected_failures_map_to_distinct_exit_codes_in_one_line(capsys, error, code, text):
  assert cli_common.guarded(_raise(error), None) == code
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("s3r: error: ") and text in err, err


def test_an_unexpected_crash_prints_its_traceback_and_exits_70(capsys):
  assert cli_common.guarded(_raise(ZeroDivisionError("bug")), None) == cli.EXIT_CODES["internal"] == 70
  err = capsys.readouterr().err
  assert "Traceback" in err and err.strip().splitlines()[-1] == "s3r: error: internal error: ZeroDivisionError: bug"


def _train_parser():
  parser = cli.build_parser(["train"])
  (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
  return commands.choices["train"]


def test_every_train_config_field_has_its_flag_and_every_other_flag_is_a_documented_exception():
  import dataclasses

  from s3r.train.config import TrainConfig, flag

  actions = {a.dest: a for a in _train_parser()._actions if a.dest != "help"}
  fields = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("flag", True)}
  unflagged = {f.name for f in dataclasses.fields(TrainConfig)} - fields
  assert unflagged == {"lr_changes"}  # set by resuming with a lower --lr, not by a flag
  assert set(actions) - fields == set(cli_train.TRAIN_ONLY_FLAGS)
  assert fields <= set(actions)
  for name in fields:
    assert actions[name].option_strings == [flag(name)] and actions[name].help, name


def test_config_flags_take_the_fields_types_defaults_choices_and_switch_bools_by_their_default():
  import argparse
  import dataclasses

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Config:
    steps: int = dataclasses.field(default=300, metadata={"help": "optimizer steps (AdamW)"})
    lr: float | None = dataclasses.field(default=None, metadata={"help": "learning rate", "default_help": "auto"})
    mode: str = dataclasses.field(default="a", metadata={"help": "mode", "choices": ("a", "b")})
    verbose: bool = dataclasses.field(default=False, metadata={"help": "say more"})
    progress: bool = dataclasses.field(default=True, metadata={"help": "no progress bar"})

  p = argparse.ArgumentParser()
  cli_train._add_config_flags(p, Config)
  helps = {a.dest: a.help for a in p._actions}
  assert helps["steps"] == "optimizer steps (AdamW; default: 300)" and helps["lr"] == "learning rate (default: auto)"
  assert vars(p.parse_args([])) == dict.fromkeys(("steps", "lr", "mode", "verbose", "progress"))
  given = p.parse_args(["--steps", "7", "--lr", "0.5", "--mode", "b", "--verbose", "--no-progress"])
  assert vars(given) == {"steps": 7, "lr": 0.5, "mode": "b", "verbose": True, "progress": False}
  with pytest.raises(SystemExit):
    p.parse_args(["--mode", "c"])


def test_resume_merges_the_given_flags_onto_the_runs_config_and_takes_switches_from_the_command():
  from s3r.train.config import TrainConfig
  from s3r.train.run.resume import SavedRun

  saved = SavedRun(config=TrainConfig(out="run", preset="tiny", steps=60, progress=False), step=60, meta={})
  args = _train_parser().parse_args(["--out", "run", "--resume", "--steps", "80"])
  cfg = cli_train.train_config(args, saved)
  assert (cfg.preset, cfg.steps, cfg.resume, cfg.progress) == ("tiny", 80, True, True)
