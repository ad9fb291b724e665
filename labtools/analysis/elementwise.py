"""Per-element work on arrays of one size, counted in a compiled program's HLO (no timing).

`gradient_sized_ops(hlo_text, elements)` counts the elementwise instructions (arithmetic, logical,
shift, compare, select, clamp, convert, round, iota, ...) and reduces that run once per element of
the `elements`-sized arrays, weighted by how often their computation runs, and the bytes of such
arrays that top-level instructions write. Data movement (broadcast, bitcast, reshape, copy,
transpose, slice), parameters, constants and GEMMs are not counted.
"""

from __future__ import annotations

import re
from collections import Counter

from labtools.analysis.hlo import DTYPE_BYTES, Computation, execution_counts, parse_hlo

ELEMENTWISE = frozenset(
  """
add subtract multiply divide remainder power atan2 and or xor not shift-left shift-right-logical
shift-right-arithmetic maximum minimum abs negate sign floor ceil round-nearest-even round-nearest-afz
convert bitcast-convert compare select clamp exponential exponential-minus-one log log-plus-one sqrt rsqrt
cbrt tanh logistic sine cosine tan erf is-finite popcnt count-leading-zeros clz iota reduce-precision
real imag
""".split()
)
REDUCES = frozenset(["reduce", "reduce-window"])


def _loop_fusions(comps: dict[str, Computation]) -> dict[str, int]:
  """Fused computation -> output elements of the kLoop fusion instruction that calls it."""
  out = {}
  for c in comps.values():
    for ins in c.instrs:
      if ins.opcode == "fusion" and "kind=kLoop" in ins.attrs:
        m = re.search(r"calls=%([\w.\-]+)", ins.attrs)
        if m:
          out[m.group(1)] = ins.elements
  return out


# Top-level instructions that write no new array of their own.
_NOT_WRITES = ("parameter", "constant", "bitcast", "reshape", "get-tuple-element", "tuple", "broadcast")


def _sized_reduce_operands(ins, shapes: dict, elements: int) -> int:
  """How many reduced operands of `ins` (the first half of its operands) have `elements` elements."""
  reduced = ins.operands[: max(1, len(ins.operands) // 2)]
  return sum(1 for o in reduced if o in shapes and shapes[o].elements == elements)


def _writer(computation: str, ins, executions: int) -> dict:
  return {
    "computation": computation,
    "name": ins.name,
    "opcode": ins.opcode,
    "dtype": ins.dtype,
    "dims": list(ins.dims),
    "executions": executions,
  }


def gradient_sized_ops(hlo_text: str, elements: int) -> dict:
  """Per-element ops of the work on `elements`-sized arrays, and bytes of such arrays written.

  Counting rule (weighted by execution count): inside a loop fusion whose output has
  `elements` elements, every elementwise instruction counts, whatever its own shape, because
  the fusion evaluates it once per output element (a per-token value broadcast inside the
  fusion, such as a shared threshold, is recomputed for every element); elsewhere (other
  fusions, unfused instructions) elementwise instructions count when their result has
  `elements` elements; a reduce counts once per operand of `elements` elements.

  Returns {'elementwise', 'reduce', 'ops_per_element', 'by_opcode', 'shape_only_ops_per_element'
  (the count of instructions whose own result has `elements` elements), 'written_bytes':
  {dtype: bytes}, 'writers': [...]} where `writers` lists the top-level instructions that
  write such arrays.
  """
  comps = parse_hlo(hlo_text)
  counts, fused = execution_counts(comps)
  loops = _loop_fusions(comps)
  by_op: Counter = Counter()
  shape_only = 0
  written: Counter = Counter()
  writers: list[dict] = []
  for c in comps.values():
    mult = counts.get(c.name, 0)
    if not mult:
      continue
    per_element_body = loops.get(c.name) == elements
    shapes = {ins.name: ins for ins in c.instrs}
    for ins in c.instrs:
      if ins.opcode in ELEMENTWISE:
        if ins.elements == elements:
          shape_only += mult
        if ins.elements == elements or per_element_body:
          by_op[ins.opcode] += mult
      elif ins.opcode in REDUCES:
        n_in = _sized_reduce_operands(ins, shapes, elements)
        if n_in:
          by_op[ins.opcode] += mult * n_in
          shape_only += mult * n_in
      if c.name not in fused and ins.elements == elements and ins.opcode not in _NOT_WRITES:
        written[ins.dtype] += mult * elements * DTYPE_BYTES.get(ins.dtype or "", 4)
        writers.append(_writer(c.name, ins, mult))
  ew = sum(v for k, v in by_op.items() if k in ELEMENTWISE)
  red = sum(v for k, v in by_op.items() if k in REDUCES)
  return {
    "elementwise": ew,
    "reduce": red,
    "ops_per_element": ew + red,
    "by_opcode": dict(sorted(by_op.items())),
    "shape_only_ops_per_element": shape_only,
    "written_bytes": dict(written),
    "writers": writers,
  }
