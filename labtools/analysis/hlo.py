"""One parser of XLA's HLO text (as printed by `compiled.as_text()`), and what is read from it directly.

`parse_hlo(text)` returns the module's computations, each a list of `Instr` (name, opcode, element
type and dims, the type text, operands, attributes after the operand list, the JAX `op_name` of
its metadata); `execution_counts` how often each computation runs per program execution (while
loops with a known trip count multiply); `find_dot` the dot of a fusion (or of a computation it
calls); `full_size_buffers` the entry computation's arrays of a given element count (what XLA
materializes in memory, outside fusions).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

DTYPE_BYTES = {
  "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
  "s64": 8, "u64": 8, "f64": 8,
}  # fmt: skip

_COMP_RE = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*(?:\(.*->.*)?\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_SHAPE_RE = re.compile(r"^(\w+)\[([\d,]*)\]")
_ARRAY_RE = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
_METADATA_RE = re.compile(r", metadata=\{[^}]*\}")
_OP_NAME_RE = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass
class Instr:
  name: str  # instruction name, without the %
  opcode: str  # e.g. "add", "fusion", "all-gather-start"
  dtype: str | None  # element type; None for a tuple
  dims: tuple[int, ...]  # dimensions; () for a tuple or a scalar
  operands: list[str]  # names of the operand instructions
  attrs: str  # the text after the operand list, metadata removed
  type_text: str = ""  # the result type as printed, e.g. "(f32[8]{0}, s8[4,4]{1,0})"
  op_name: str = ""  # the JAX operation it came from (metadata), "" if none

  @property
  def elements(self) -> int:
    return math.prod(self.dims) if self.dtype is not None else 0


@dataclasses.dataclass
class Computation:
  name: str  # computation name, without the %
  entry: bool  # the ENTRY computation
  instrs: list[Instr]  # in program order


def array_types(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """(element type, dims) of every array in a (possibly tuple) type text."""
  return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY_RE.findall(type_text)]


def _matching(s: str, start: int) -> int:
  """Index of the parenthesis closing the one at s[start]."""
  depth = 0
  for i in range(start, len(s)):
    if s[i] == "(":
      depth += 1
    elif s[i] == ")":
      depth -= 1
      if depth == 0:
        return i
  return len(s) - 1


def _instr(line: str) -> Instr | None:
  m = _INSTR_RE.match(line)
  if not m:
    return None
  op_name = _OP_NAME_RE.search(line)
  name, rest = m.group(1), _METADATA_RE.sub("", m.group(2))
  if rest.startswith("("):  # tuple shape
    end = _matching(rest, 0)
    dtype, dims, type_text, rest = None, (), rest[: end + 1], rest[end + 1 :].lstrip()
  else:
    sm = _SHAPE_RE.match(rest)
    if not sm:
      return None
    dtype, dims = sm.group(1), tuple(int(d) for d in sm.group(2).split(",") if d)
    type_text, _, rest = rest.partition(" ")
  paren = rest.find("(")
  if paren < 0:
    return None
  end = _matching(rest, paren)
  operands = re.findall(r"%([\w.\-]+)", rest[paren : end + 1])
  return Instr(name, rest[:paren].strip(), dtype, dims, operands, rest[end + 1 :], type_text,
               op_name.group(1) if op_name else "")  # fmt: skip


def parse_hlo(text: str) -> dict[str, Computation]:
  """Computations of an HLO module's text, by name."""
  comps: dict[str, Computation] = {}
  cur = None
  for line in text.splitlines():
    if cur is None:
      m = _COMP_RE.match(line)
      if m:
        cur = comps[m.group(2)] = Computation(m.group(2), bool(m.group(1)), [])
      continue
    if line.startswith("}"):
      cur = None
    elif (ins := _instr(line)) is not None:
      cur.instrs.append(ins)
  return comps


_CALLEE_RE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")


def execution_counts(comps: dict[str, Computation]) -> tuple[dict[str, int], set[str]]:
  """How many times each computation runs per program execution, and which are fusion bodies."""
  calls: dict[str, list[tuple[str, int]]] = defaultdict(list)
  fused: set[str] = set()
  for c in comps.values():
    for ins in c.instrs:
      trip = 1
      if ins.opcode == "while":
        m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', ins.attrs)
        trip = int(m.group(1)) if m else 1
      for key, callee in _CALLEE_RE.findall(ins.attrs):
        if key == "to_apply" and ins.opcode != "call":
          continue  # reducer/comparator regions run per element on scalars: not counted
        calls[c.name].append((callee, trip))
        if key == "calls" and ins.opcode == "fusion":
          fused.add(callee)
      if m := re.search(r"branch_computations=\{([^}]*)\}", ins.attrs):
        calls[c.name] += [(callee, 1) for callee in re.findall(r"%([\w.\-]+)", m.group(1))]
  counts: dict[str, int] = defaultdict(int)

  def visit(name: str, mult: int, depth: int = 0) -> None:
    if depth > 64:
      return
    counts[name] += mult
    for callee, trip in calls.get(name, ()):
      visit(callee, mult * trip, depth + 1)

  for c in comps.values():
    if c.entry:
      visit(c.name, 1)
  return dict(counts), fused


CALLS_RE = re.compile(r"\bcalls=%([\w.\-]+)")  # the computation a fusion (or a call) runs
DOT_OPCODES = ("dot", "scaled-dot")


def find_dot(
  comps: dict[str, Computation], name: str, opcodes: tuple[str, ...] = DOT_OPCODES, depth: int = 0
) -> tuple[Instr, Computation] | None:
  """(the first instruction of `opcodes` with two operands, its computation) in computation `name` or,
  failing that, in a computation it calls, depth first (a nested GEMM fusion), at most 4 calls deep;
  None if there is none. `opcodes`: also "convolution" where a convolution counts as the GEMM (XLA:TPU)."""
  comp = comps.get(name)
  if comp is None or depth > 4:
    return None
  for ins in comp.instrs:
    if ins.opcode in opcodes and len(ins.operands) >= 2:
      return ins, comp
  for ins in comp.instrs:
    for callee in CALLS_RE.findall(ins.attrs):
      if (found := find_dot(comps, callee, opcodes, depth + 1)) is not None:
        return found
  return None


def full_size_buffers(hlo_text: str, num_elements: int) -> list[tuple[str, str, str]]:
  """(name, element type, opcode) of the entry computation's instructions with that many elements.

  These are the arrays XLA writes to memory; anything computed inside a fusion is not listed.
  Parameters are excluded.
  """
  entry = next(c for c in parse_hlo(hlo_text).values() if c.entry)
  return [(i.name, i.dtype, i.opcode) for i in entry.instrs
          if i.opcode != "parameter" and i.dims and i.elements == num_elements and i.dtype is not None]  # fmt: skip


def compiled_text(fn: Callable[..., Any], *args: Any) -> str:
  """Optimized HLO text of `jax.jit(fn)` for these arguments."""
  import jax

  return hlo_text(jax.jit(fn).lower(*args).compile())


def hlo_text(compiled: Any) -> str:
  """Optimized HLO text of a compiled program (`jax.stages.Compiled`); RuntimeError if the backend gives none."""
  text = compiled.as_text()
  if text is None:
    raise RuntimeError("the backend printed no HLO text for this program")
  return text
