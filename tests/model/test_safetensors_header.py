"""The safetensors reader refuses every malformed header with its own one-line error (HFError naming the
file), as the reference `safetensors` implementation refuses them: overlapping or non-contiguous byte
ranges, shapes and offsets that are not lists of integers, unknown dtypes. Hypothesis fuzzes the header
parser: whatever the bytes, opening a file either succeeds with tensors that tile its data or raises HFError."""

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3r.model.hf.errors import HFError
from s3r.model.hf.safetensors import DTYPES, SafetensorsFile, header_bytes

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _file(tmp_path, header, data: bytes = b"", name="x.safetensors"):
  text = header if isinstance(header, bytes) else json.dumps(header).encode()
  path = tmp_path / name
  path.write_bytes(struct.pack("<Q", len(text)) + text + data)
  return path


def _open(path):
  """SafetensorsFile(path) and every tensor read, or the HFError."""
  f = SafetensorsFile(path)
  return {n: f.read(n) for n in f.names}


def test_a_well_formed_file_reads_back_its_tensors(tmp_path):
  arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.int8), "empty": np.zeros(0)}
  head, offsets = header_bytes({n: (a.shape, a.dtype) for n, a in arrays.items()})
  body = b"".join(arrays[n].tobytes() for n in sorted(arrays, key=lambda n: offsets[n]))
  path = tmp_path / "ok.safetensors"
  path.write_bytes(head + body)
  read = _open(path)
  for name, array in arrays.items():
    np.testing.assert_array_equal(read[name], array)


def test_overlapping_tensors_are_refused_naming_both(tmp_path):
  header = {
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
  }
  with pytest.raises(HFError, match=r"x\.safetensors: tensors a and b overlap"):
    _open(_file(tmp_path, header, bytes(12)))


def test_a_gap_between_tensors_is_refused(tmp_path):
  header = {
    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
  }
  with pytest.raises(HFError, match="4 unused bytes of data after tensor a"):
    _open(_file(tmp_path, header, bytes(12)))


def test_bytes_after_the_last_tensor_are_refused(tmp_path):
  header = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
  with pytest.raises(HFError, match="4 bytes of data after the last tensor"):
    _open(_file(tmp_path, header, bytes(8)))


@pytest.mark.parametrize(
  "entry",
  [
    {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]},
    {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]},
    {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]},
    {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]},
    {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]},
    {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]},
    {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]},
    {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]},
    {"shape": [2], "data_offsets": [0, 8]},
    [0, 8],
  ],
  ids=[
    "string-shape",
    "float-dim",
    "bool-dim",
    "negative-dim",
    "string-offset",
    "three-offsets",
    "list-dtype",
    "unknown-dtype",
    "no-dtype",
    "not-an-object",
  ],
)
def test_a_malformed_entry_is_refused_naming_the_tensor(tmp_path, entry):
  with pytest.raises(HFError, match=r"x\.safetensors: tensor w has an unreadable header entry"):
    _open(_file(tmp_path, {"w": entry}, bytes(8)))


def test_metadata_must_map_to_strings(tmp_path):
  header = {"__metadata__": {"format": 1}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
  with pytest.raises(HFError, match="__metadata__"):
    _open(_file(tmp_path, header, bytes(1)))


def test_a_header_nested_too_deep_is_refused(tmp_path):
  with pytest.raises(HFError, match="unreadable safetensors header"):
    _open(_file(tmp_path, b"[" * 100_000))


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_any_header_bytes_open_or_raise_hferror(tmp_path, header, data):
  try:
    _open(_file(tmp_path, header, data))
  except HFError:
    pass


_JSON = st.recursive(
  st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
  lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
  max_leaves=6,
)
_DIM = st.integers(-1, 4) | _JSON
_ENTRY = st.fixed_dictionaries(
  {
    "dtype": st.sampled_from([*DTYPES, "F31"]) | _JSON,
    "shape": st.lists(_DIM, max_size=3) | _JSON,
    "data_offsets": st.lists(st.integers(-2, 40) | _JSON, min_size=2, max_size=2) | _JSON,
  }
)


@FUZZ
@given(st.dictionaries(st.text(max_size=3), _ENTRY | _JSON, max_size=4), st.integers(0, 48))
def test_fuzzed_headers_open_only_when_the_tensors_tile_the_data(tmp_path, header, n_data):
  """Structured headers, nearly well formed: a file that opens holds tensors whose byte ranges tile its
  data exactly, each read with its declared shape; every other one is an HFError."""
  try:
    read = _open(_file(tmp_path, header, bytes(n_data)))
  except HFError:
    return
  entries = {n: e for n, e in header.items() if n != "__metadata__"}
  ranges = sorted(tuple(e["data_offsets"]) for e in entries.values())
  ends = [0, *(end for _, end in ranges)]
  assert [begin for begin, _ in ranges] == ends[:-1] and ends[-1] == n_data
  for name, entry in entries.items():
    assert read[name].shape == tuple(entry["shape"])
    assert read[name].nbytes == math.prod(entry["shape"]) * DTYPES[entry["dtype"]].itemsize
