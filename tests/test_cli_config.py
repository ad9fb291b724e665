"""`s3r train --config FILE`: keys are the flags, flags on the command line win, a run's own config.json is a valid
file, and an unknown key, a wrong type or a broken file is one error line naming the key."""

import argparse
import dataclasses
import json

import pytest

from s3r import cli
from s3r.cli import train as cli_train
from s3r.cli.config_file import apply_config_file, read_config_file
from s3r.train.config import ConfigError, TrainConfig
from tests.faults.conftest import run_in_process


def _parse(*argv):
  parser = cli.build_parser(["train"])
  (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
  return commands.choices["train"].parse_args([str(a) for a in argv])


def _config(*argv) -> TrainConfig:
  args = _parse(*argv)
  if args.config:
    apply_config_file(args, args.config)
  return cli_train.train_config(args)


TOML = """
preset = "tiny"
steps = 40
grad-accum = 2
batch = 8
lr = 1e-3
data = "python-stdlib"
progress = false
"""


def test_every_key_of_a_toml_file_sets_its_flag_and_flags_given_override_it(tmp_path):
  path = tmp_path / "run.toml"
  path.write_text(TOML)
  cfg = _config("--config", path, "--out", tmp_path / "run")
  assert (cfg.preset, cfg.steps, cfg.grad_accum, cfg.batch, cfg.lr, cfg.progress) == ("tiny", 40, 2, 8, 1e-3, False)
  over = _config("--config", path, "--out", tmp_path / "run", "--steps", "12", "--grad-accum", "4", "--lr", "0.01")
  assert (over.steps, over.grad_accum, over.lr, over.batch) == (12, 4, 0.01, 8)


def test_a_json_file_with_dashes_or_underscores_and_null_for_unset_fields(tmp_path):
  path = tmp_path / "run.json"
  path.write_text(json.dumps({"preset": "tiny", "max_train_docs": 20, "eval-every": 5, "mesh": None}))
  cfg = _config("--config", path, "--out", "run")
  assert (cfg.max_train_docs, cfg.eval_every, cfg.mesh) == (20, 5, None)


def test_a_runs_own_config_json_is_a_valid_config_and_gives_its_settings_back(tmp_path):
  saved = TrainConfig(out=str(tmp_path / "old"), preset="tiny", steps=30, grad_accum=2, resume=True, progress=False)
  saved = TrainConfig.from_dict({**saved.to_dict(), "lr_changes": [[10, 1e-3]]})
  # the layout `s3r train` writes: the settings under "train", beside the model, parameter count, mesh and data
  run_json = {"train": saved.to_dict(), "model": {"d_model": 64}, "param_count": 1, "mesh": {}, "data": {}}
  (tmp_path / "config.json").write_text(json.dumps(run_json))
  cfg = _config("--config", tmp_path / "config.json", "--out", tmp_path / "new")
  assert cfg == dataclasses.replace(saved, out=str(tmp_path / "new"), resume=False)  # all but where and how it ran


@pytest.mark.parametrize(
  "text, suffix, message",
  [
    ('stpes = 3\npreset = "tiny"', ".toml", "unknown key 'stpes'; did you mean 'steps'?"),
    ('steps = "ten"', ".toml", "key 'steps' must be an integer, got 'ten'"),
    ("batch = 8.0", ".toml", "key 'batch' must be an integer, got 8.0"),
    ("progress = 1", ".toml", "key 'progress' must be true or false, got 1"),
    ('{"lr": "fast"}', ".json", "key 'lr' must be a number, got 'fast'"),
    ('{"steps": null}', ".json", "key 'steps' must be an integer, got None"),
    ('{"steps": 3,}', ".json", "not valid JSON"),
    ("steps = = 3", ".toml", "not valid TOML"),
    ("[1, 2]", ".json", "must hold a table of settings"),
    ("steps: 3", ".yaml", "a config file is .json or .toml"),
  ],
)
def test_an_unknown_key_a_wrong_type_or_a_broken_file_is_one_line_naming_it(tmp_path, text, suffix, message):
  path = tmp_path / f"run{suffix}"
  path.write_text(text)
  with pytest.raises(ConfigError) as e:
    read_config_file(path)
  assert message in str(e.value) and str(e.value).startswith(f"--config {path}: ")
  proc = run_in_process("train", "--config", path, "--out", "run", cwd=tmp_path)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
  assert not (tmp_path / "run").exists()


def test_a_value_out_of_range_in_the_file_is_refused_naming_the_flag(tmp_path):
  path = tmp_path / "run.toml"
  path.write_text('preset = "tiny"\nbatch = 6\ngrad_accum = 4\n')
  with pytest.raises(ConfigError, match="--batch must be divisible by --grad-accum=4"):
    _config("--config", path, "--out", "run")
  with pytest.raises(ConfigError, match="cannot read it"):
    read_config_file(tmp_path / "missing.toml")
