"""Why a temp allocation is larger than what is live in it at once: its layout over offset and time.

XLA places every temporary of a program in one preallocated block per memory space, at an offset
its heap simulator chooses, and buffers whose lifetimes do not overlap share bytes. The block's
size is the highest offset + size of any buffer in it; what is live at once never exceeds it,
and the difference is space the packing could not fill (buffers of different sizes and lifetimes
leave holes below the one that ends highest).

`heap_layout` reads the buffer-assignment dump (offset and size of every value) and the
live-range dump (the program step at which each value is defined and its last use) that
`labtools.analysis.memory.buffer_breakdown` already compiles for, and returns per temp allocation:
its size, the most bytes live in it at one step and where (the large buffers live then, and every
buffer live then summed by array type), and
the buffer that sets the size, with the large buffers below it during its lifetime ("large": at
least 1/TOP_FRACTION of the allocation) and the largest span below it that stays free for its
whole lifetime (when that span is smaller than the buffer, the buffers bounding it are why the
buffer sits where it does), and every large buffer's place and lifetime ("blocks", what
`python -m benchmarks heapplot` draws). A value's live range `a-b` is inclusive of both
steps, as XLA prints it; values that XLA keeps at the same offset and size at the same step
(a tuple element and its get-tuple-element, a loop's parameter and its update) count once.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

from labtools.analysis.buffers import Allocation, Value, parse_assignment

_RANGE_RE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}):(\d+)-(\d+)\s*$")
_COLOR_RE = re.compile(r"color (\d+)")
TOP_FRACTION = 64


def parse_live_ranges(text: str) -> dict[str, tuple[int, int]]:
  """{value name with shape index: (first step, last step)} from the BufferLiveRange section."""
  out: dict[str, tuple[int, int]] = {}
  inside = False
  for line in text.splitlines():
    if line.strip() == "BufferLiveRange:":
      inside = True
      continue
    if inside:
      m = _RANGE_RE.match(line)
      if not m:
        break
      out[m.group(1) + m.group(2)] = (int(m.group(3)), int(m.group(4)))
  return out


@dataclasses.dataclass
class Block:
  """Bytes [offset, offset + size) of one allocation, held from step `start` to step `end` (inclusive)
  by the values named (one value, or several that XLA keeps there at overlapping steps)."""

  offset: int
  size: int
  start: int
  end: int
  values: list[str]
  type_text: str

  def short(self) -> dict:
    fields = {"offset": self.offset, "bytes": self.size, "start": self.start, "end": self.end}
    return fields | {"buffer": self.values[0], "type": self.type_text.split("{")[0]}


def _blocks(values: list[Value], ranges: dict[str, tuple[int, int]]) -> list[Block]:
  """One block per (offset, size) slot and lifetime: values sharing a slot with overlapping lifetimes
  are one block (their lifetimes merged)."""
  by_slot: dict[tuple[int, int], list[tuple[int, int, str, str]]] = defaultdict(list)
  for v in values:
    if v.size and v.name in ranges:
      by_slot[(v.offset, v.size)].append((*ranges[v.name], v.name, v.type_text))
  blocks: list[Block] = []
  for (offset, size), spans in by_slot.items():
    cur = None
    for start, end, name, type_text in sorted(spans):
      if cur is not None and start <= cur.end:
        cur.end = max(cur.end, end)
        cur.values.append(name)
        continue
      cur = Block(offset, size, start, end, [name], type_text)
      blocks.append(cur)
  return blocks


def _live_curve(blocks: list[Block], steps: int) -> list[int]:
  delta = [0] * (steps + 2)
  for b in blocks:
    delta[b.start] += b.size
    delta[b.end + 1] -= b.size
  curve, live = [], 0
  for d in delta[: steps + 1]:
    live += d
    curve.append(live)
  return curve


def _by_type(blocks: list[Block]) -> dict[str, list[int]]:
  """{array type: [count, bytes]} of `blocks`, every size included, largest total first."""
  out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
  for b in blocks:
    entry = out[b.type_text.split("{")[0]]
    entry[0] += 1
    entry[1] += b.size
  return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def _largest_gap_below(top: Block, blocks: list[Block]) -> dict:
  """The largest span of [0, top.offset) that no block occupies at any step of top's lifetime, and the
  blocks that bound it from above and below (buffers of every size count here)."""
  busy = sorted(
    ((b.offset, b.offset + b.size, b) for b in blocks if b is not top and b.offset < top.offset),
    key=lambda t: t[:2],
  )
  busy = [t for t in busy if t[2].start <= top.end and t[2].end >= top.start]
  gap_offset, gap_bytes, gap_start = 0, 0, top.offset
  gap_below: list[Block] = []
  reach, below = 0, []
  for start, end, b in [*busy, (top.offset, top.offset, top)]:
    if start - reach > gap_bytes:
      gap_offset, gap_bytes, gap_start, gap_below = reach, start - reach, start, below
    if end > reach:
      reach, below = end, [b]
    elif end == reach:
      below = [*below, b]
  above = [x for s, _, x in busy if s == gap_start] or [top]
  return {
    "offset": gap_offset,
    "bytes": gap_bytes,
    "below": [x.short() for x in gap_below],
    "above": [x.short() for x in above],
  }


def allocation_layout(allocation: Allocation, values: list[Value], ranges: dict) -> dict | None:
  """Size, live peak and the buffer that sets the size of one allocation (see the module docstring); None
  where no value of it has a live range."""
  blocks = _blocks([v for v in values if v.allocation == allocation.index], ranges)
  if not blocks:
    return None
  curve = _live_curve(blocks, max((b.end for b in blocks), default=0))
  peak_step = max(range(len(curve)), key=curve.__getitem__)
  # the buffer that sets the size: the highest-ending one among those of at least 1/TOP_FRACTION of the
  # allocation (tiny buffers stacked above it add their bytes to `above_top_bytes`)
  large = [b for b in blocks if b.size * TOP_FRACTION >= allocation.size] or blocks
  top = max(large, key=lambda b: (b.offset + b.size, b.size))
  under = [b for b in large if b is not top and b.offset < top.offset and b.start <= top.end and b.end >= top.start]
  return {
    "allocation": allocation.index,
    "color": int(m.group(1)) if (m := _COLOR_RE.search(allocation.flags)) else 0,
    "bytes": allocation.size,
    "live_peak_bytes": curve[peak_step],
    "live_peak_step": peak_step,
    "live_at_peak": [b.short() for b in sorted(large, key=lambda b: -b.size) if b.start <= peak_step <= b.end],
    "live_at_peak_by_type": _by_type([b for b in blocks if b.start <= peak_step <= b.end]),
    "top": top.short(),
    "above_top_bytes": allocation.size - (top.offset + top.size),
    "live_most_during_top_bytes": max(curve[top.start : top.end + 1]),
    "under_top": [b.short() for b in sorted(under, key=lambda b: b.offset)],
    "largest_gap_below_top": _largest_gap_below(top, blocks),
    "blocks": [b.short() for b in sorted(large, key=lambda b: (b.offset, b.start))],
  }


def heap_layout(assignment: str, live_range: str) -> list[dict]:
  """`allocation_layout` of every temp allocation holding a value with a live range, largest first."""
  allocs, values = parse_assignment(assignment)
  ranges = parse_live_ranges(live_range)
  layouts = [allocation_layout(a, values, ranges) for a in allocs.values() if a.kind == "temp" and a.size]
  return sorted((x for x in layouts if x is not None), key=lambda r: -r["bytes"])
