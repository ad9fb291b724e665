"""`s3r train --config FILE`: a run's settings from a JSON or TOML file, flags on the command line on top.

Every key is a field of `s3r.train.config.TrainConfig`, spelled as the field (`grad_accum`) or as its flag
without the dashes (`grad-accum`); a bool key sets the switch (`progress = false` is --no-progress). The
multi-process flags (--coordinator, --num-processes, --process-id, --distributed) stay on the command line:
they differ from process to process. A run's own `config.json` (`{"train": {...}, "model": ...}`) is a valid
file: its "train" settings are read, all but `resume` (which records how that run was last started). An unknown
key, a value of the wrong type or a file that does not parse is a ConfigError of one line naming the file and
the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
import tomllib
import typing
from typing import Any

from s3r.quant.recipes import RecipeField
from s3r.train.config import ConfigError, TrainConfig

SUFFIXES = (".json", ".toml")
RUN_ONLY = ("resume",)  # what a run's config.json records about its last start, not a setting


def read_config_file(path: str | pathlib.Path) -> dict[str, Any]:
  """The TrainConfig fields that the file at `path` sets, by field name, each value checked against the
  field's type; ConfigError (one line, naming the key) otherwise."""
  p = pathlib.Path(path)
  where = f"--config {path}"
  if p.suffix.lower() not in SUFFIXES:
    raise ConfigError(f"{where}: a config file is .json or .toml, got {p.suffix or 'no suffix'!r}")
  try:
    text = p.read_text(encoding="utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
  try:
    data = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
  except tomllib.TOMLDecodeError as e:
    raise ConfigError(f"{where}: not valid TOML ({str(e).splitlines()[0]})") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{where}: the file must hold a table of settings (key = value), got {type(data).__name__}")
  if isinstance(data.get("train"), dict) and "model" in data:  # a run's own config.json
    data = {k: v for k, v in data["train"].items() if k not in RUN_ONLY}
  fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
  hints = typing.get_type_hints(TrainConfig)
  out: dict[str, Any] = {}
  for key, value in data.items():
    name = str(key).replace("-", "_")
    if name not in fields:
      close = difflib.get_close_matches(name, fields, n=1)
      hint = (
        f"; did you mean {close[0]!r}?" if close else f" (the keys are the fields of s3r train: {', '.join(fields)})"
      )
      raise ConfigError(f"{where}: unknown key {key!r}{hint}")
    if why := _type_error(hints[name], value):
      raise ConfigError(f"{where}: key {key!r} must be {why}, got {value!r}")
    out[name] = value
  return out


def _type_error(annotation, value) -> str | None:
  """What `value` should be for a field annotated `annotation` (None if it is that)."""
  if typing.get_origin(annotation) is tuple:  # lr_changes: (step, peak) pairs; TrainConfig checks the pairs
    return None if isinstance(value, (list, tuple)) else "a list of [step, peak] pairs"
  kinds = [t for t in typing.get_args(annotation) or (annotation,) if t is not type(None)]
  optional = type(None) in typing.get_args(annotation)
  if value is None:
    return None if optional else _kind_name(kinds)
  for kind in kinds:
    if kind is bool and isinstance(value, bool):
      return None
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
      return None
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
      return None
    if kind in (str, RecipeField) and isinstance(value, str):  # a recipe by its name: TrainConfig parses it
      return None
  return _kind_name(kinds) + (" (or null)" if optional else "")


def _kind_name(kinds) -> str:
  names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", RecipeField: "a recipe name"}
  return " or ".join(names.get(k, getattr(k, "__name__", str(k))) for k in kinds)


def apply_config_file(args, path: str | pathlib.Path) -> None:
  """Sets every attribute of the parsed flags `args` that the command line left unset (None) to the file's value:
  the flags given override the file."""
  for name, value in read_config_file(path).items():
    if getattr(args, name, None) is None:
      setattr(args, name, value)
