"""The collectives of a compiled (SPMD-partitioned) XLA program, read from its HLO text.

`collectives(hlo_text)` lists every all-reduce, reduce-scatter, all-gather, all-to-all and
collective-permute of the per-device program, with its element types, shapes, group size,
the JAX operation it came from (`op_name` metadata) and its byte counts:
- `bytes`: the size of the collective's full buffer on one device: the all-reduced
  array (operand = result), the gathered result of an all-gather, the operand of a
  reduce-scatter (before scattering), the operand of an all-to-all or collective-permute.
  This is the "volume" reported by `python -m benchmarks comm`.
- `wire_bytes`: what one device sends with bandwidth-optimal (ring) algorithms over a group of
  n devices: 2(n-1)/n of the buffer for an all-reduce, (n-1)/n for an all-gather,
  reduce-scatter or all-to-all, the whole buffer for a permute (0 for a device that sends to itself).
A tuple-shaped (combined) collective is split into one entry per element type.
Asynchronous pairs (`-start`/`-done`, GPU and TPU) are counted once, at the start.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

from labtools.analysis.hlo import DTYPE_BYTES, Instr, array_types, parse_hlo

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")

_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}")
_DIMS = re.compile(r"dimensions=\{(\d+)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


@dataclasses.dataclass(frozen=True)
class Collective:
  name: str  # HLO instruction name
  kind: str  # one of KINDS
  dtype: str  # element type (one entry per element type of a tuple-shaped collective)
  shapes: tuple[tuple[int, ...], ...]  # shapes of this element type's buffers
  group_size: int  # devices per replica group
  op_name: str  # the JAX operation it came from (metadata), "" if none
  bytes: int  # the full buffer on one device (see the module docstring)
  wire_bytes: float  # bytes one device sends with ring algorithms

  @property
  def largest_elements(self) -> int:
    return max(math.prod(s) for s in self.shapes)


def _group_size(line: str) -> int:
  if m := _IOTA_GROUPS.search(line):
    return int(m.group(2))
  if m := _LIST_GROUPS.search(line):
    return len(m.group(1).split("},{")[0].strip("{}").split(","))
  if m := _MESH_GROUPS.search(line):
    axes = dict((k.strip("' "), int(v)) for k, v in (a.split("=") for a in m.group(1).split(",")))
    return math.prod(_axis_size(a, axes) for a in m.group(2).split(",") if a.strip())
  return 1


_SUB_AXIS = re.compile(r"'?([\w.]+)'?:\((\d+)\)(\d+)")


def _axis_size(item: str, axes: dict[str, int]) -> int:
  """Devices along one entry of a mesh replica group: a whole axis ('tensor') or a sub-axis
  ('tensor':(2)4, the 4 devices of 'tensor' that follow a stride of 2 of them)."""
  if m := _SUB_AXIS.fullmatch(item.strip()):
    return int(m.group(3))
  return axes[item.strip("' ")]


def _wire_factor(kind: str, n: int, line: str) -> float:
  if kind == "collective-permute":
    pairs = _PAIRS.search(line)
    if pairs and all(a == b for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))):
      return 0.0
    return 1.0
  if n <= 1:
    return 0.0
  return 2 * (n - 1) / n if kind == "all-reduce" else (n - 1) / n


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective of the compiled program `hlo_text` (see the module docstring)."""
  found = []
  for comp in parse_hlo(hlo_text).values():
    for ins in comp.instrs:
      kind, start = ins.opcode.removesuffix("-start"), ins.opcode.endswith("-start")
      if kind in KINDS:
        found += _entries(ins, kind, start)
  return found


def _entries(ins: Instr, kind: str, start: bool) -> list[Collective]:
  arrays, n = array_types(ins.type_text), _group_size(ins.attrs)
  if start and kind in ("all-gather", "collective-permute") and len(arrays) > 1:
    # async start: (operand(s), result(s)[, contexts]); keep the gathered result / the operand
    arrays = [max(arrays, key=lambda a: math.prod(a[1]))] if kind == "all-gather" else arrays[:1]
  if kind == "reduce-scatter":  # the operand is n times the result
    dim = int(m.group(1)) if (m := _DIMS.search(ins.attrs)) else 0
    arrays = [(dt, shape[:dim] + (shape[dim] * n,) + shape[dim + 1 :]) for dt, shape in arrays]
  by_dtype = defaultdict(list)
  for dt, shape in arrays:
    by_dtype[dt].append(shape)
  out = []
  for dt, shapes in by_dtype.items():
    size = sum(math.prod(s) for s in shapes) * DTYPE_BYTES[dt]
    out.append(
      Collective(
        name=ins.name,
        kind=kind,
        dtype=dt,
        shapes=tuple(shapes),
        group_size=n,
        op_name=ins.op_name,
        bytes=size,
        wire_bytes=size * _wire_factor(kind, n, ins.attrs),
      )
    )
  return out


def volume(colls: list[Collective], *, wire: bool = False) -> dict[str, dict[str, float]]:
  """{kind: {dtype: bytes}} summed over `colls` (only kinds and types that occur)."""
  out: dict[str, dict[str, float]] = {}
  for c in colls:
    per = out.setdefault(c.kind, {})
    per[c.dtype] = per.get(c.dtype, 0) + (c.wire_bytes if wire else c.bytes)
  return out
