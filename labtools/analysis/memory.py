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
lays out each temp allocation over offset and time (`labtools.analysis.heap`: why an allocation is
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

from labtools.analysis import heap, hlo
from labtools.analysis.buffers import Allocation, Value, parse_assignment

_PEAK_RE = re.compile(r"^\s*Live ranges at (\d+) \(peak\):")
_LIVE_RE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}): (\d+) bytes")


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
  """`labtools.analysis.heap.heap_layout` where XLA wrote a live-range dump (else [])."""
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
