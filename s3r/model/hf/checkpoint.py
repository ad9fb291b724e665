"""A Hugging Face checkpoint folder: `config.json` and the weights in one `*.safetensors` file or
sharded with `model.safetensors.index.json`. Tensors are looked up by their Hub name and read one
at a time, memory-mapped (s3r.model.hf.safetensors)."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from s3r.model.hf.errors import HFError
from s3r.model.hf.safetensors import SafetensorsFile

INDEX = "model.safetensors.index.json"


def read_json(path: pathlib.Path) -> dict:
  """The JSON object in `path`; HFError naming the file when it is missing or malformed."""
  if not path.is_file():
    raise HFError(f"{path}: no such file")
  try:
    value = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise HFError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise HFError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


class Checkpoint:
  """The tensors of a checkpoint folder by Hub name (`names`, `shape`, `read`), every file's header
  checked when the folder is opened (a missing or truncated shard fails before anything is read)."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    if not self.path.is_dir():
      raise HFError(f"{self.path}: not a checkpoint folder (no such directory)")
    self.config = read_json(self.path / "config.json")
    files = [SafetensorsFile(f) for f in self._weight_files()]
    self._file_of: dict[str, SafetensorsFile] = {}
    for f in files:
      for name in f.names:
        self._file_of.setdefault(name, f)
    self._check_index(files)

  def _weight_files(self) -> list[pathlib.Path]:
    index = self.path / INDEX
    if index.exists():
      weight_map = read_json(index).get("weight_map")
      if not isinstance(weight_map, dict) or not weight_map:
        raise HFError(f"{index}: no weight_map")
      names = sorted(set(weight_map.values()))
      for name in names:
        if not (self.path / name).is_file():
          raise HFError(f"{index} names {name}, which is not in {self.path}")
      self._index: dict[str, str] | None = weight_map
      return [self.path / name for name in names]
    self._index = None
    found = sorted(self.path.glob("*.safetensors"))
    if not found:
      raise HFError(f"{self.path}: no *.safetensors weights (and no {INDEX})")
    return found

  def _check_index(self, files: list[SafetensorsFile]) -> None:
    if self._index is None:
      return
    for name, file in self._index.items():
      stored = self._file_of.get(name)
      if stored is None or stored.path.name != file:
        raise HFError(f"{self.path / INDEX} puts tensor {name} in {file}, which does not hold it")

  @property
  def names(self) -> set[str]:
    return set(self._file_of)

  def has(self, name: str) -> bool:
    return name in self._file_of

  def shape(self, name: str) -> tuple[int, ...]:
    return self._file(name).shape(name)

  def read(self, name: str) -> np.ndarray:
    """The tensor memory-mapped in its stored dtype (no copy is made)."""
    return self._file(name).read(name)

  def _file(self, name: str) -> SafetensorsFile:
    if name not in self._file_of:
      raise HFError(f"{self.path}: the checkpoint has no tensor {name}")
    return self._file_of[name]
