"""The kernels of an optimized HLO module, as the performance model sees them (`python -m benchmarks perfmodel`).

`kernels(text, tpu=False)` walks the computations a program runs: the entry computation, while-loop
bodies (times the loop's known trip count, `labtools.analysis.hlo.execution_counts`), called and
conditional computations; fusion bodies are read for what a kernel computes, never as kernels of
their own. Each launched instruction becomes a `Kernel`:

- gemm: a Triton GEMM fusion or a cuDNN GEMM fusion, a cuBLAS / cuBLASLt call (XLA:GPU), or a fusion
  holding a `convolution` or `dot` (XLA:TPU); FLOPs 2·|output|·K from the dot's dimensions; `dtype`
  the dot's operand types as the tensor cores see them ("bf16", "s8", "f8", "f32" = TF32, "mixed");
- attention: cuDNN's fused attention; FLOPs 4·|Q|·S_kv forward (halved with a causal mask), 2.5 times
  that for the backward call;
- collective: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute (bytes moved);
- memory: everything else that runs (loop / input / output fusions, copies, transposes, in-place
  updates, Pallas kernels): bytes read and written, and vector operations per element type.

Bytes: each distinct operand's array once plus the output; an operand that the fused computation
only slices (a layer of a scanned weight stack) counts as the slices, and an output written by an
in-place `dynamic-update-slice` as the update. Vector operations: the elements of every arithmetic
instruction of the fused computation (data movement, such as broadcasts, bitcasts and slices, is free).

`group` names what a kernel is for, for the model's breakdown: read from `jax.named_scope` names in
the instructions' metadata (`s3r_quantize`, `s3r_threshold`, `s3r_ec`, `optimizer`), else from its
kind (GEMMs by operand type, attention, collectives, other).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter

from labtools.analysis import hlo

BYTES = {**hlo.DTYPE_BYTES, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e8m0fnu": 1, "s4": 1, "u4": 1}
FP8 = ("f8e4m3fn", "f8e5m2", "f8e4m3")
_ARRAY_RE = re.compile(r"\b(" + "|".join(sorted(BYTES, key=len, reverse=True)) + r")\[([\d,]*)\]")
_KIND_RE = re.compile(r'"kind":"(__[\w$]+)"')
_TARGET_RE = re.compile(r'custom_call_target="([^"]+)"')
_CONTRACT_RE = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_BLAS_CONTRACT_RE = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_DIM_LABELS_RE = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_GEMM_OPCODES = (*hlo.DOT_OPCODES, "convolution")  # a convolution is the GEMM where XLA:TPU writes one
FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional",
  "after-all", "partition-id", "replica-id", "opt-barrier", "optimization-barrier", "copy-start", "copy-done",
  "domain", "add-dependency", "send-done", "recv-done", "all-reduce-done", "all-gather-done",
  "collective-permute-done", "async-done", "async-update",
}  # fmt: skip
MOVES = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "broadcast", "reshape", "transpose", "copy",
  "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "iota", "gather", "reverse",
  "bitcast-convert", "fusion",
}  # fmt: skip
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
SCOPES = ("s3r_threshold", "s3r_ec", "s3r_quantize", "optimizer")  # checked in this order


@dataclasses.dataclass
class Kernel:
  name: str
  kind: str  # gemm, attention, collective, memory
  count: int  # executions per program run
  bytes: int  # read + written per execution
  flops: float = 0.0  # tensor-core / MXU FLOPs per execution (gemm, attention)
  dtype: str = ""  # gemm operand type: bf16, s8, f8, f32, mixed
  vector_ops: dict[str, float] = dataclasses.field(default_factory=dict)  # element type -> ops per execution
  group: str = "other"
  shape: str = ""  # gemm: MxNxK

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def _array_bytes(type_text: str) -> int:
  return sum(BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in _ARRAY_RE.findall(type_text))


def _first_array(type_text: str) -> tuple[str, tuple[int, ...]] | None:
  m = _ARRAY_RE.search(type_text)
  return (m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)) if m else None


def _gemm_type(types: list[str]) -> str:
  kinds = {("f8" if t in FP8 else t) for t in types}
  if len(kinds) == 1:
    (t,) = kinds
    return {"f16": "bf16", "s32": "s8", "u8": "s8"}.get(t, t)
  return "f8" if kinds <= {"f8"} else "mixed"


class Module:
  """An optimized HLO module: its computations, how often each runs, and its kernels."""

  def __init__(self, text: str, tpu: bool = False):
    self.tpu = tpu
    self.comps = hlo.parse_hlo(text)
    _infer_trip_counts(self.comps, text)
    self.counts, self.fused = hlo.execution_counts(self.comps)
    self.types = {c.name: {i.name: i for i in c.instrs} for c in self.comps.values()}

  # --- what a fused computation computes ---------------------------------------------------

  def _dot_flops(self, dot, comp) -> tuple[float, str, str]:
    """(FLOPs, operand type, MxNxK) of a dot or convolution instruction."""
    ops = [self.types[comp.name].get(o) for o in dot.operands[:2]]
    lhs = ops[0].dims if ops[0] is not None else ()
    k = 1
    if dot.opcode == "convolution":
      labels = _DIM_LABELS_RE.search(dot.attrs)
      if labels and lhs:
        k = math.prod(d for d, c in zip(lhs, labels.group(1), strict=False) if c == "f")
    elif (m := _CONTRACT_RE.search(dot.attrs)) and lhs:
      k = math.prod(lhs[int(i)] for i in m.group(1).split(",") if i)
    out = math.prod(dot.dims) if dot.dims else 1
    dtype = _gemm_type([o.dtype for o in ops if o is not None and o.dtype])
    n = dot.dims[-1] if dot.dims else 1
    return 2.0 * out * k, dtype, f"{out // max(n, 1)}x{n}x{k}"

  def _vector_ops(self, comp_name: str, depth: int = 0) -> Counter:
    """Elements of every arithmetic instruction of a fused computation (and the ones it calls), by type."""
    ops: Counter = Counter()
    comp = self.comps.get(comp_name)
    if comp is None or depth > 4:
      return ops
    for ins in comp.instrs:
      if ins.opcode == "fusion":
        for callee in hlo.CALLS_RE.findall(ins.attrs):
          ops.update(self._vector_ops(callee, depth + 1))
      elif ins.opcode not in MOVES and ins.dtype is not None:
        operand = self.types[comp.name].get(ins.operands[0]) if ins.operands else None
        elements = max(ins.elements, operand.elements if operand is not None and ins.opcode == "reduce" else 0)
        ops[ins.dtype if ins.opcode != "compare" or operand is None else (operand.dtype or "f32")] += elements
    return ops

  def _param_bytes(self, comp_name: str) -> dict[int, int]:
    """Bytes each parameter of a fused computation is read: the slices taken of it if it is only sliced."""
    comp = self.comps.get(comp_name)
    if comp is None:
      return {}
    users: dict[str, list] = {}
    for ins in comp.instrs:
      for o in ins.operands:
        users.setdefault(o, []).append(ins)
    out: dict[int, int] = {}
    for ins in comp.instrs:
      if ins.opcode != "parameter":
        continue
      m = re.match(r"\s*(\d+)", ins.attrs) or re.search(r"parameter\((\d+)\)", ins.attrs)
      index = int(m.group(1)) if m else len(out)
      out[index] = self._read_bytes(ins, users)
    return out

  def _read_bytes(self, ins, users: dict, depth: int = 0) -> int:
    full = _array_bytes(ins.type_text)
    uses = users.get(ins.name, [])
    if not uses or depth > 3:
      return full
    total = 0
    for u in uses:
      if u.opcode in ("dynamic-slice", "slice", "gather"):
        total += _array_bytes(u.type_text)
      elif u.opcode == "bitcast":
        total += self._read_bytes(u, users, depth + 1)
      elif u.opcode == "dynamic-update-slice" and u.operands and u.operands[0] == ins.name:
        total += 0  # updated in place: the write is counted with the output
      else:
        return full
    return min(total, full)

  def _out_bytes(self, ins, callee: str | None) -> int:
    comp = self.comps.get(callee) if callee else None
    if comp is not None and comp.instrs:
      root = comp.instrs[-1]
      roots = [root]
      if root.opcode == "tuple":
        roots = [self.types[comp.name].get(o) for o in root.operands]
      total = 0
      for r in roots:
        if r is None:
          continue
        if r.opcode == "dynamic-update-slice" and len(r.operands) > 1:
          upd = self.types[comp.name].get(r.operands[1])
          total += _array_bytes(upd.type_text) if upd is not None else 0
        else:
          total += _array_bytes(r.type_text)
      return total
    return _array_bytes(ins.type_text)

  def _io_bytes(self, ins, comp, callee: str | None) -> int:
    per_param = self._param_bytes(callee) if callee else {}
    seen, total = set(), 0
    for i, o in enumerate(ins.operands):
      if o in seen:
        continue
      seen.add(o)
      src = self.types[comp.name].get(o)
      total += per_param.get(i, _array_bytes(src.type_text) if src is not None else 0)
    return total + self._out_bytes(ins, callee)

  def _group(self, ins, callee: str | None) -> str | None:
    names = [ins.op_name]
    comp = self.comps.get(callee) if callee else None
    if comp is not None:
      names += [i.op_name for i in comp.instrs]
    found: Counter = Counter()
    for n in names:
      for scope in SCOPES:
        if f"/{scope}/" in f"/{n}/" or n.startswith(scope):
          found[scope] += 1
          break
    return found.most_common(1)[0][0] if found else None

  # --- the kernels --------------------------------------------------------------------------

  def kernels(self) -> list[Kernel]:
    out = []
    for comp in self.comps.values():
      count = self.counts.get(comp.name, 0)
      if not count or comp.name in self.fused or self._is_condition(comp.name):
        continue
      for ins in comp.instrs:
        k = self._kernel(ins, comp, count)
        if k is not None:
          out.append(k)
    return out

  def _is_condition(self, name: str) -> bool:
    if not hasattr(self, "_conditions"):
      self._conditions = {
        m.group(1)
        for c in self.comps.values()
        for i in c.instrs
        for m in [re.search(r"condition=%([\w.\-]+)", i.attrs)]
        if m
      }
    return name in self._conditions

  def _kernel(self, ins, comp, count: int) -> Kernel | None:
    op = ins.opcode
    if op in FREE or (op.endswith("-done") and not op.startswith("async")):
      return None
    if self.tpu and ins.dtype is not None and not ins.dims and op not in ("fusion", "custom-call"):
      return None  # a scalar op on the TPU's scalar unit
    callee_m = hlo.CALLS_RE.search(ins.attrs)
    callee = callee_m.group(1) if callee_m else None
    io = self._io_bytes(ins, comp, callee)
    if op == "dynamic-update-slice" and len(ins.operands) > 1:  # in place: the update read and written
      update = self.types[comp.name].get(ins.operands[1])
      io = 2 * _array_bytes(update.type_text) if update is not None else io
    elif op in ("dynamic-slice", "slice"):  # the slice read and written, not the array it is taken from
      io = 2 * _array_bytes(ins.type_text)
    scope = self._group(ins, callee)
    base = op.removesuffix("-start")
    if base in COLLECTIVES:
      return Kernel(ins.name, "collective", count, io, group="collectives")
    if op == "custom-call":
      return self._custom_call(ins, comp, count, io, scope)
    if op == "fusion":
      kind = _KIND_RE.search(ins.attrs)
      gemm_kind = kind and kind.group(1) in ("__triton_gemm", "__triton_nested_gemm_fusion", "__cudnn$fusion")
      found = hlo.find_dot(self.comps, callee, _GEMM_OPCODES) if callee and (gemm_kind or self.tpu) else None
      if found is not None:
        flops, dtype, shape = self._dot_flops(*found)
        return Kernel(ins.name, "gemm", count, io, flops, dtype, group=_gemm_group(scope, dtype), shape=shape)
      ops = self._vector_ops(callee) if callee else Counter()
      return Kernel(ins.name, "memory", count, io, vector_ops=dict(ops), group=scope or _unscoped(ins, ops))
    if op in ("dot", "convolution"):
      flops, dtype, shape = self._dot_flops(ins, comp)
      return Kernel(ins.name, "gemm", count, io, flops, dtype, group=_gemm_group(scope, dtype), shape=shape)
    ops = {} if op in MOVES else {ins.dtype or "f32": float(ins.elements)}
    return Kernel(ins.name, "memory", count, io, vector_ops=ops, group=scope or "other")

  def _custom_call(self, ins, comp, count: int, io: int, scope: str | None) -> Kernel | None:
    target = _TARGET_RE.search(ins.attrs)
    t = target.group(1) if target else ""
    operands = [self.types[comp.name].get(o) for o in ins.operands]
    if t.startswith("__cublas$"):
      out = _first_array(ins.type_text)
      lhs = operands[0].dims if operands and operands[0] is not None else ()
      m = _BLAS_CONTRACT_RE.search(ins.attrs)
      k = math.prod(lhs[int(i.strip('" '))] for i in m.group(1).split(",") if i.strip('" ')) if m and lhs else 1
      n_out = math.prod(out[1]) if out else 0
      dtype = _gemm_type([o.dtype for o in operands[:2] if o is not None and o.dtype])
      n = out[1][-1] if out and out[1] else 1
      shape = f"{n_out // max(n, 1)}x{n}x{k}"
      return Kernel(ins.name, "gemm", count, io, 2.0 * n_out * k, dtype, group=_gemm_group(scope, dtype), shape=shape)
    if t.startswith("__cudnn$fmha"):
      q = operands[0].dims if operands and operands[0] is not None else ()
      kv = operands[1].dims if len(operands) > 1 and operands[1] is not None else ()
      s_kv = kv[1] if len(kv) == 4 else 1
      flops = 4.0 * math.prod(q) * s_kv if q else 0.0
      if '"mask_type":"CAUSAL"' in ins.attrs or "CAUSAL" in ins.attrs:
        flops /= 2
      if "Backward" in t:
        flops *= 2.5
      return Kernel(ins.name, "attention", count, io, flops, "bf16", group="attention")
    if t in ("__gpu$xla.gpu.triton", "tpu_custom_call") and (gemm := _grouped_gemm(ins, operands)) is not None:
      flops, dtype, shape = gemm
      return Kernel(ins.name, "gemm", count, io, flops, dtype, group=_gemm_group(scope, dtype), shape=shape)
    return Kernel(ins.name, "memory", count, io, group=scope or "other")


def _grouped_gemm(ins, operands) -> tuple[float, str, str] | None:
  """(FLOPs, operand type, shape) of a Pallas / Mosaic kernel that is a grouped GEMM, read from its shapes: x [T, K]
  and w [E, K, N] (or [E, N, K]) giving [T, N]; or x [T, K] and g [T, N] giving dW [E, K, N]. None otherwise."""
  out = _first_array(ins.type_text)
  arrays = [o for o in operands if o is not None and o.dtype is not None and len(o.dims) in (2, 3)]
  if out is None:
    return None
  dims = out[1]
  if len(dims) == 2:
    t, n = dims
    w = next((o for o in arrays if len(o.dims) == 3 and n in o.dims[1:]), None)
    x = next((o for o in arrays if len(o.dims) == 2 and o.dims[0] == t), None)
    if w is None or x is None:
      return None
    k = w.dims[1] if w.dims[2] == n else w.dims[2]
    if x.dims[1] != k:
      return None
    return 2.0 * t * k * n, _gemm_type([x.dtype, w.dtype]), f"{t}x{n}x{k}"
  if len(dims) == 3:
    _, k, n = dims
    x = next((o for o in arrays if len(o.dims) == 2 and o.dims[1] == k), None)
    g = next(
      (o for o in arrays if len(o.dims) == 2 and o.dims[1] == n and x is not None and o.dims[0] == x.dims[0]), None
    )
    if x is None or g is None:
      return None
    return 2.0 * x.dims[0] * k * n, _gemm_type([x.dtype, g.dtype]), f"{k}x{n}x{x.dims[0]}"
  return None


def _infer_trip_counts(comps: dict, text: str) -> None:
  """Gives a while loop without a printed known trip count (XLA:TPU prints none) the count its condition states:
  `compare(counter, constant(N)), direction=LT` with the counter starting at 0, as a scanned decoder's loop is.
  Written into the instruction's attributes in the form `hlo.execution_counts` reads."""
  values = dict(re.findall(r"%([\w.\-]+) = [su]32\[\][^ ]* constant\((\d+)\)", text))
  for comp in comps.values():
    for ins in comp.instrs:
      if ins.opcode != "while" or "known_trip_count" in ins.attrs:
        continue
      cond = re.search(r"condition=%([\w.\-]+)", ins.attrs)
      c = comps.get(cond.group(1)) if cond else None
      if c is None or not c.instrs:
        continue
      root = c.instrs[-1]
      if root.opcode != "compare" or "direction=LT" not in root.attrs or len(root.operands) != 2:
        continue
      if (n := values.get(root.operands[1])) is not None:
        ins.attrs += f', backend_config={{"known_trip_count":{{"n":"{n}"}}}}'


def _gemm_group(scope: str | None, dtype: str) -> str:
  """A GEMM's group: its operand type (a quantizer fused into its prologue does not make it a quantizer), except
  the error correction's own products."""
  return "s3r_ec" if scope == "s3r_ec" else f"gemm {dtype}"


def _unscoped(ins, ops: Counter) -> str:
  """The group of a fusion without named scopes (programs of older revisions): random bits hashed in u32
  (the thresholds), else int8 / FP8 codes written (a quantizer), else other."""
  if ops.get("u32", 0) > 0.5 * sum(ops.values()):
    return "s3r_threshold"
  if any(dt in ("s8", *FP8) for dt, _ in _ARRAY_RE.findall(ins.type_text)):
    return "s3r_quantize"
  return "other"


def kernels(text: str, tpu: bool = False) -> list[Kernel]:
  """The kernels of one optimized HLO module (see the module docstring)."""
  return Module(text, tpu).kernels()
