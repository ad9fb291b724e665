"""XLA's buffer-assignment dump, parsed: the allocations of a compiled program and the HLO values
placed in each (offset and size). `memory` reads the buffers live at the peak from it, `heap` lays
each temp allocation out over offset and program step.
"""

from __future__ import annotations

import dataclasses
import re

_ALLOC_RE = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE_RE = re.compile(r"^\s*value: <(\d+) ([^\s>]+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")


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
