"""The `s3r` command line: recipes, train end to end on `tiny`, eval, and one-line errors."""

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from s3r import cli
from s3r.quant import RECIPES


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
  assert len(lines) == len(RECIPES)
  for line, (name, recipe) in zip(lines, RECIPES.items()):
    assert line.split()[0] == name and line.endswith(recipe.description)


def test_train_on_tiny_runs_end_to_end_and_eval_reads_its_checkpoint(tmp_path, capsys):
  data, out = _corpus(tmp_path / "data"), tmp_path / "run"
  argv = ["train", "--preset", "tiny", "--recipe", "s3r", "--steps", "6", "--warmup", "1", "--batch", "4",
          "--seq", "32", "--vocab", "300", "--data", str(data), "--out", str(out), "--eval-every", "3",
          "--ckpt-every", "3", "--eval-batches", "2", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  assert "final validation loss: val_loss" in printed and str(out / "loss.png") in printed
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(1, 7)) and "val_loss" in records[-1]
  assert (out / "loss.png").stat().st_size > 0 and (out / "config.json").exists()
  assert (out / "checkpoints" / "6").is_dir()

  assert cli.main(["eval", str(out), "--eval-batches", "2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  val = next(line for line in lines if line.startswith("val:"))
  assert f"loss {records[-1]['val_loss']:.4f}" in val and "perplexity" in val


def _run_cli(*args, cwd):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "s3r.cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                        timeout=120)


@pytest.mark.parametrize("args, message", [
    (["train", "--data", "does/not/exist", "--preset", "tiny", "--out", "run"], "does not exist"),
    (["train", "--steps", "-3", "--out", "run"], "steps"),
    (["train", "--recipe", "fp4", "--out", "run"], "invalid choice"),
    (["train", "--mesh", "data=3", "--out", "run"], "--mesh"),
    (["eval", "no/such/run"], "no checkpoint"),
])
def test_bad_input_exits_2_with_one_error_line_and_no_traceback(tmp_path, args, message):
  proc = _run_cli(*args, cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0] and "error" in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr
