"""Where a compiled program's temporary memory goes: XLA's buffer assignment, buffer by buffer.

`compiled.memory_analysis()` gives one number, the temp bytes. This module compiles the program
once more with XLA's dump enabled (`xla_dump_to`, a per-compilation option, into a temporary
directory) and reads three of the files XLA writes for the optimized module:

- `*after_optimizations-buffer-assignment.txt`: the allocations (size; parameter, constant,
  thread-local, maybe-live-out, preallocated-temp) and the HLO values placed in each, with
  their offset and size; the temp bytes are the preallocated-temp allocation(s).
- `*after_optimizations-live-range.txt`: the program order and XLA's own list of the buffers
  live at the step where the live bytes peak ("Live ranges at N (peak)").
- `*after_optimizations.txt`: the HLO, for each buffer's producing instruction (opcode and the
  JAX operation of its metadata).

`buffer_breakdown` returns, per buffer live at the peak (or, where a backend writes no live-range
dump, per buffer of the temp allocation): its size, type, where it sits
(parameter, output, temp) and what produced it; `by_dtype` sums them per element type; "heap"
lays out each temp allocation over offset and time (`s3r.analysis.heap`: why an allocation is
larger than what is live in it at once).
Works on every backend that dumps buffer assignments (CPU and GPU do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import tempfile
from collections import defaultdict
from typing import Any

from s3r.analysis import hlo

_ALLOC_RE = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE_RE = re.compile(r"^\s*value: <(\d+) ([^\s>]+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_PEAK_RE = re.compile(r"^\s*Live ranges at (\d+) \(peak\):")
_LIVE_RE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}): (\d+) bytes")


@dataclasses.dataclass
class Allocation:
  index: int
  size: int  # bytes
  flags: str  # XLA's description, e.g. "parameter 1, shape |f32[8]| at ShapeIndex {}" or "preallocated-temp"

  @property
  def kind(self) -> str:
    """parameter, constant, thread-local, output (an allocation that may hold a program output;
    XLA:CPU also places temporaries there before the output is written), temp."""
    for kind in ("parameter", "constant", "thread-local"):
      if kind in self.flags:
        return kind
    if "maybe-live-out" in self.flags or "output shape" in self.flags:
      return "output"
    return "temp"


@dataclasses.dataclass
class Value:
  id: int
  name: str  # instruction name with the shape index, e.g. "fusion.3{}" or "custom-call.2{0}"
  size: int  # bytes
  offset: int  # bytes into its allocation
  type_text: str  # e.g. "s32[1024,2048]{1,0}"
  allocation: int  # index of the allocation holding it


def parse_assignment(text: str) -> tuple[dict[int, Allocation], list[Value]]:
  """Allocations by index and the values placed in them, from a buffer-assignment dump."""
  allocs: dict[int, Allocation] = {}
  values: list[Value] = []
  cur = None
  for line in text.splitlines():
    if m := _ALLOC_RE.match(line):
      cur = int(m.group(1))
      allocs[cur] = Allocation(cur, int(m.group(2)), m.group(3).lstrip(", "))
    elif cur is not None and (m := _VALUE_RE.match(line)):
      name = m.group(2) if "{" in m.group(2) else m.group(2) + "{}"
      values.append(Value(int(m.group(1)), name, int(m.group(3)), int(m.group(4)), m.group(5).strip(), cur))
    elif line.startswith(("Total bytes", "Used values")):
      cur = None
  return allocs, values


def parse_peak(text: str) -> tuple[int | None, list[tuple[str, int]]]:
  """(step of the peak, [(buffer name with shape index, bytes)]) from a live-range dump."""
  step, live = None, []
  for line in text.splitlines():
    if step is None:
      if m := _PEAK_RE.match(line):
        step = int(m.group(1))
      continue
    m = _LIVE_RE.match(line)
    if not m:
      break
    live.append((m.group(1) + m.group(2), int(m.group(3))))
  return step, live


def temp_bytes(allocs: dict[int, Allocation]) -> int:
  """Bytes of the temp allocations (what memory_analysis() calls temp_size_in_bytes)."""
  return sum(a.size for a in allocs.values() if a.kind == "temp")


def _one_per_buffer(live: list[tuple[str, int]], by_name: dict[str, Value]) -> list[tuple[str, int]]:
  """`live` with each buffer once: values live together at one offset and size of one allocation share that
  memory (a while loop's parameter and the update of the loop-carried value it aliases, for example)."""
  seen: set[tuple[int, int, int]] = set()
  out = []
  for name, size in live:
    v = by_name.get(name)
    where = (v.allocation, v.offset, v.size) if v else None
    if where is None or where not in seen:
      out.append((name, size))
    if where is not None:
      seen.add(where)
  return out


def breakdown(assignment: str, live_range: str | None, hlo_text: str) -> dict:
  """The buffers live at the peak, with size, type, kind and producer, largest first; values that XLA
  lists live at the peak in the same memory (aliased) count once.

  Without a live-range dump (`live_range` None), "peak" lists every value of the temp
  allocations instead, each once (values sharing one offset and size are one buffer), and
  "peak_step" is None.
  """
  allocs, values = parse_assignment(assignment)
  if live_range is not None:
    step, live = parse_peak(live_range)
    live = _one_per_buffer(live, {v.name: v for v in values})
  else:
    seen: dict[tuple[int, int, int], str] = {}
    for v in values:
      if allocs[v.allocation].kind == "temp" and v.size:
        seen.setdefault((v.allocation, v.offset, v.size), v.name)
    step, live = None, [(name, size) for (_, _, size), name in seen.items()]
  by_name = {v.name: v for v in values}
  instrs = {i.name: i for c in hlo.parse_hlo(hlo_text).values() for i in c.instrs}
  rows: list[dict[str, Any]] = []
  for name, size in live:
    v = by_name.get(name)
    ins = instrs.get(name.partition("{")[0])
    arrays = hlo.array_types(v.type_text if v else (ins.type_text if ins else ""))
    dtype, dims = arrays[0] if len(arrays) == 1 else ("tuple", ())
    rows.append(
      {
        "buffer": name,
        "bytes": size,
        "dtype": dtype,
        "dims": list(dims),
        "kind": allocs[v.allocation].kind if v else "unknown",
        "allocation": v.allocation if v else None,
        "offset": v.offset if v else None,
        "opcode": ins.opcode if ins else "",
        "op_name": ins.op_name if ins else "",
      }
    )
  rows.sort(key=lambda r: (-r["bytes"], r["buffer"]))
  by_dtype: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
  for r in rows:
    by_dtype[r["kind"]][r["dtype"]] += r["bytes"]
  return {
    "temp_bytes": temp_bytes(allocs),
    "peak_step": step,
    "peak_live_bytes": sum(r["bytes"] for r in rows),
    "peak": rows,
    "by_kind_dtype": {k: dict(sorted(d.items())) for k, d in sorted(by_dtype.items())},
    "temp_values": [dataclasses.asdict(v) for v in values if allocs[v.allocation].kind == "temp"],
    "heap": _heap_layout(assignment, live_range),
  }


def _heap_layout(assignment: str, live_range: str | None) -> list[dict]:
  """`s3r.analysis.heap.heap_layout` where XLA wrote a live-range dump (else [])."""
  from s3r.analysis import heap  # heap reads this module's parsers

  return heap.heap_layout(assignment, live_range) if live_range is not None else []


@contextlib.contextmanager
def _persistent_cache_off():
  """XLA writes its dumps only when it really compiles, and a hit in JAX's persistent compilation
  cache (`JAX_COMPILATION_CACHE_DIR`) returns an executable without compiling. JAX decides once per
  process whether it uses that cache and keeps the answer in a private flag, which is switched off
  around the one compile (where that flag does not exist, nothing changes)."""
  from jax._src import compilation_cache as cc

  if not hasattr(cc, "_cache_used") or not hasattr(cc, "_cache_checked"):
    yield
    return
  before = cc._cache_checked, cc._cache_used
  cc._cache_checked, cc._cache_used = True, False
  try:
    yield
  finally:
    cc._cache_checked, cc._cache_used = before


def buffer_breakdown(lowered, compiler_options: dict | None = None) -> tuple[dict, Any]:
  """(breakdown, compiled) of a `jax.jit(f).lower(...)`: compiles it with XLA's dump on (and with
  `compiler_options`, e.g. the flags of the program being measured)."""
  with tempfile.TemporaryDirectory(prefix="s3r_buffers_") as d, _persistent_cache_off():
    options = {**(compiler_options or {}), "xla_dump_to": d, "xla_dump_hlo_as_text": True}
    compiled = lowered.compile(compiler_options=options)

    def read(suffix: str, required: bool = True) -> str | None:
      paths = sorted(glob.glob(os.path.join(d, f"*after_optimizations{suffix}")))
      if not paths:
        if not required:
          return None
        raise RuntimeError(f"buffer_breakdown: XLA wrote no *after_optimizations{suffix} (backend without dumps?)")
      # one module per compilation; if helpers were compiled too, the main module is the largest
      with open(max(paths, key=os.path.getsize)) as f:
        return f.read()

    assignment, hlo_text = read("-buffer-assignment.txt"), read(".txt")
    assert assignment is not None and hlo_text is not None  # required: `read` raises instead
    result = breakdown(assignment, read("-live-range.txt", required=False), hlo_text)
  return result, compiled
