"""A memory-mapped reader and a streaming writer of the safetensors format (8-byte little-endian header length, a JSON
header of {name: {dtype, shape, data_offsets}}, then the raw little-endian tensor bytes).

Reading a tensor maps its bytes without copying them (`numpy.memmap`); bfloat16 and the float8
types are JAX's numpy dtypes, so a bf16 checkpoint is read on the host as is (no `safetensors`
package needed).
A file whose header or data ends early is refused when it is opened, naming the file and tensor, and so is
one whose header the `safetensors` package refuses: a shape or offset that is not a list of integers >= 0, an
unknown dtype, offsets that do not hold the shape, and byte ranges that overlap, leave a gap or do not
end at the end of the file.
`SafetensorsWriter` lays a file out as the `safetensors` package does (names sorted, the same header
bytes) and writes it one tensor at a time.
"""

from __future__ import annotations

import json
import math
import pathlib
import struct
from typing import TypeGuard

import jax.numpy as jnp
import numpy as np

from s3r.model.hf.errors import HFError

DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(jnp.bfloat16),
  "F8_E4M3": np.dtype(jnp.float8_e4m3fn),
  "F8_E5M2": np.dtype(jnp.float8_e5m2),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_MAX_HEADER = 100 * 2**20  # bytes; the format's own limit


class SafetensorsFile:
  """The tensors of one .safetensors file: `names`, `shape(name)`, `dtype(name)`, `read(name)` (a
  read-only memory-mapped numpy array in the stored dtype, little-endian)."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self._header, self._data_start = _read_header(self.path)
    self._map: np.memmap | None = None

  @property
  def names(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._header[name]["shape"])

  def dtype(self, name: str) -> np.dtype:
    return DTYPES[self._header[name]["dtype"]]

  def read(self, name: str) -> np.ndarray:
    entry = self._header[name]
    begin, end = entry["data_offsets"]
    if self._map is None:
      self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
    raw = self._map[self._data_start + begin : self._data_start + end]
    return raw.view(DTYPES[entry["dtype"]].newbyteorder("<")).reshape(entry["shape"])


def _read_header(path: pathlib.Path) -> tuple[dict, int]:
  size = path.stat().st_size
  with path.open("rb") as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise HFError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", prefix)
    if n > min(_MAX_HEADER, size - 8):
      raise HFError(f"{path}: truncated or not a safetensors file (header of {n} bytes in a {size}-byte file)")
    try:
      header = json.loads(f.read(n))
    except (ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors; nesting too deep
      raise HFError(f"{path}: unreadable safetensors header ({type(e).__name__}: {e})"[:300]) from None
  if not isinstance(header, dict):
    raise HFError(f"{path}: unreadable safetensors header (not a JSON object)")
  metadata = header.pop("__metadata__", None)
  if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
    raise HFError(f"{path}: unreadable safetensors header (__metadata__ is not a map of strings)")
  data = size - 8 - n
  ranges = sorted((*_check_entry(path, name, entry, data), name) for name, entry in header.items())
  _check_layout(path, ranges, data)
  return header, 8 + n


def _check_entry(path: pathlib.Path, name: str, entry, data: int) -> tuple[int, int]:
  """(begin, end) of tensor `name`'s bytes; HFError unless `entry` names a known dtype, a shape of integers
  >= 0 and two integer offsets that hold exactly that shape within the `data` bytes of the file."""
  dtype, shape, offsets = (
    (entry.get(k) for k in ("dtype", "shape", "data_offsets")) if isinstance(entry, dict) else 3 * [None]
  )
  if not (isinstance(dtype, str) and dtype in DTYPES and _integers(shape) and _integers(offsets) and len(offsets) == 2):
    raise HFError(f"{path}: tensor {name} has an unreadable header entry {entry!r}"[:300])
  begin, end = offsets
  if end - begin != math.prod(shape) * DTYPES[dtype].itemsize or begin < 0:
    raise HFError(f"{path}: tensor {name}: data offsets {begin}..{end} do not hold shape {shape} of {dtype}")
  if end > data:
    raise HFError(f"{path}: truncated: tensor {name} ends at byte {end} of the data, the file holds {data}")
  return begin, end


def _integers(value) -> TypeGuard[list[int]]:
  """A JSON list of integers >= 0 (not booleans, not floats)."""
  return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _check_layout(path: pathlib.Path, ranges: list[tuple[int, int, str]], data: int) -> None:
  """HFError unless the tensors' byte ranges (sorted (begin, end, name)) tile the data bytes from 0 to `data`
  without overlap or gap, as the format requires."""
  position, previous = 0, None
  for begin, end, name in ranges:
    if begin < position:
      raise HFError(f"{path}: tensors {previous} and {name} overlap (bytes {begin}..{position} of the data)")
    if begin > position:
      where = f"after tensor {previous}" if previous else "before the first tensor"
      raise HFError(f"{path}: {begin - position} unused bytes of data {where} (at byte {position})")
    position, previous = end, name
  if position != data:
    raise HFError(f"{path}: {data - position} bytes of data after the last tensor (the tensors end at byte {position})")


CODES = {dtype: code for code, dtype in DTYPES.items()}


Specs = dict[str, tuple[tuple[int, ...], np.dtype]]  # {tensor name: (shape, dtype)}


def header_bytes(specs: Specs, metadata: dict | None = None) -> tuple[bytes, dict]:
  """(the 8-byte length and JSON header, {name: (begin, end)} data offsets) of a file holding the tensors
  `specs` ({name: (shape, dtype)}) in name order, as the `safetensors` package lays it out (compact JSON,
  `__metadata__` first, padded with spaces to a multiple of 8 bytes)."""
  header: dict = {"__metadata__": metadata} if metadata else {}
  offsets, pos = {}, 0
  for name in sorted(specs):
    shape, dtype = specs[name]
    size = math.prod(shape) * np.dtype(dtype).itemsize
    offsets[name] = (pos, pos + size)
    header[name] = {"dtype": CODES[np.dtype(dtype)], "shape": list(shape), "data_offsets": [pos, pos + size]}
    pos += size
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)
  return struct.pack("<Q", len(text)) + text, offsets


class SafetensorsWriter:
  """Writes one .safetensors file tensor by tensor in any order (`write(name, array)`, each at the offset its
  name has in the header), so that only one tensor is held at a time; `finish()` checks that every one was.
  A writer that is not finished should be closed (`close()`)."""

  def __init__(self, path: str | pathlib.Path, specs: Specs):
    self.path, self._specs = pathlib.Path(path), dict(specs)
    head, self._offsets = header_bytes(self._specs, {"format": "pt"})
    self._start, self._left = len(head), set(self._specs)
    self._file = self.path.open("wb")
    self._file.write(head)

  def write(self, name: str, array: np.ndarray) -> None:
    shape, dtype = self._specs[name]
    if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
      raise ValueError(f"{self.path}: tensor {name} is {array.dtype}{list(array.shape)}, declared {dtype}{list(shape)}")
    self._file.seek(self._start + self._offsets[name][0])
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    self._file.write(little.reshape(-1).view(np.uint8).data)  # no copy of a contiguous little-endian array
    self._left.discard(name)

  def close(self) -> None:
    self._file.close()

  def finish(self) -> None:
    """Closes the file; RuntimeError if a declared tensor was not written."""
    self.close()
    if self._left:
      raise RuntimeError(f"{self.path}: tensors {sorted(self._left)} were declared but never written")
