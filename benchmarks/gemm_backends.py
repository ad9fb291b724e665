"""Which kernel XLA:GPU chose for each GEMM of an optimized program, read from `compiled.as_text()`.

`gemms(text)` lists every GEMM instruction of the module once (a while loop's body once, not per trip), with
- `name`: the instruction's name in the optimized HLO, which is the kernel's name in a profile of the
  program (a Triton GEMM fusion's kernel is named after the fusion; a cuBLAS call's kernels are cuBLAS's
  own and carry the HLO name only in the trace event's metadata, see `benchmarks.trace_kernels`);
- `backend`: `triton` (a fusion of kind `__triton_gemm` or `__triton_nested_gemm_fusion`), `cublas`
  (`__cublas$gemm`), `cublaslt` (`__cublas$lt$matmul`), `cublaslt_f8` (`__cublas$lt$matmul$f8`), `cudnn`
  (a `__cudnn$fusion`), `xla_fusion` (a dot inside any other fusion, as XLA:CPU emits them) or `dot`
  (a dot outside any fusion);
- `lhs`, `rhs`, `out`: element types of the two operands and of the product;
- `m`, `n`, `k`, `batch`: the product's sizes (from the dot's operand shapes and contracting dimensions);
- `tile`: a Triton GEMM's output tile and contracting tile, warps and stages (`"64x32x64 w4 s1"`), as the
  autotuner (or, without one, XLA's default configuration) set them; "" otherwise.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

from labtools.analysis import hlo

_KIND_RE = re.compile(r'"kind":"(__[\w$]+)"')
_TARGET_RE = re.compile(r'custom_call_target="([^"]+)"')
_DIMS_RE = {
  side: re.compile(side + r"_(contracting|batch)_dims=\{([\d,]*)\}") for side in ("lhs", "rhs")
}  # dot attributes
_CFG_DIMS_RE = re.compile(r'"(lhs|rhs)_(contracting|batch)_dimensions":\[([^\]]*)\]')  # gemm_backend_config
TRITON_KINDS = ("__triton_gemm", "__triton_nested_gemm_fusion")
CUSTOM_CALLS = {"__cublas$gemm": "cublas", "__cublas$lt$matmul": "cublaslt", "__cublas$lt$matmul$f8": "cublaslt_f8"}


def _sizes(lhs: tuple[int, ...], rhs: tuple[int, ...], dims: dict[str, list[int]]) -> dict[str, int]:
  """m, n, k, batch of a dot from its operand dims and its contracting / batch dimension numbers."""
  lc, lb, rc, rb = (dims.get(key, []) for key in ("lhs_contracting", "lhs_batch", "rhs_contracting", "rhs_batch"))
  if any(d >= len(lhs) for d in lc + lb) or any(d >= len(rhs) for d in rc + rb):
    return {}
  k = math.prod(lhs[d] for d in lc)
  batch = math.prod(lhs[d] for d in lb)
  m = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
  n = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in rb)
  return {"m": m, "n": n, "k": k, "batch": batch}


def _dot_dims(attrs: str) -> dict[str, list[int]]:
  out = {}
  for side, pattern in _DIMS_RE.items():
    for kind, values in pattern.findall(attrs):
      out[f"{side}_{kind}"] = [int(v) for v in values.split(",") if v]
  return out


def _config_dims(attrs: str) -> dict[str, list[int]]:
  return {
    f"{s}_{k}": [int(v.strip('"')) for v in vals.split(",") if v.strip()] for s, k, vals in _CFG_DIMS_RE.findall(attrs)
  }


def triton_tile(attrs: str) -> str:
  """ "BMxBNxBK wW sS" of a Triton GEMM fusion's backend config ("" if it has none): the legacy
  `triton_gemm_config`, or the nested fusion's `block_level_fusion_config` (output tile; the contracting tile
  is the `sizes` of the dot in the fused computation, appended by `gemms`)."""
  m = re.search(r'"backend_config"?=?(\{.*\})\s*$', attrs) or re.search(r"backend_config=(\{.*\})", attrs)
  if not m:
    return ""
  try:
    cfg = json.loads(m.group(1))
  except json.JSONDecodeError:
    return ""
  fusion = cfg.get("fusion_backend_config", {})
  if "triton_gemm_config" in fusion:
    t = fusion["triton_gemm_config"]
    return f"{t.get('block_m')}x{t.get('block_n')}x{t.get('block_k')} w{t.get('num_warps')} s{t.get('num_stages')}"
  block = fusion.get("block_level_fusion_config")
  if block:
    tiles = block.get("output_tiles") or [{}]
    sizes = "x".join(str(s) for s in tiles[0].get("sizes", []))
    return f"{sizes} w{block.get('num_warps')} s{block.get('num_stages')}"
  return ""


def _contracting_tile(dot) -> str:
  m = re.search(r'backend_config=\{"sizes":\["(\d+)"\]\}', dot.attrs)
  return m.group(1) if m else ""


def gemms(text: str) -> list[dict]:
  """The GEMMs of an optimized GPU HLO module (see the module docstring)."""
  comps = hlo.parse_hlo(text)
  bodies = {
    c
    for comp in comps.values()
    for ins in comp.instrs
    if ins.opcode == "fusion"
    for c in hlo.CALLS_RE.findall(ins.attrs)
  }
  out = []
  for comp in comps.values():
    if comp.name in bodies:  # a fusion's own computation: its dot belongs to the fusion that calls it
      continue
    types = {i.name: (i.dtype, i.dims) for i in comp.instrs}
    for ins in comp.instrs:
      row = None
      if ins.opcode == "fusion":
        kind = _KIND_RE.search(ins.attrs)
        callee = hlo.CALLS_RE.search(ins.attrs)
        gemm_kind = kind and kind.group(1) in (*TRITON_KINDS, "__cudnn$fusion")
        found = hlo.find_dot(comps, callee.group(1)) if callee else None
        if gemm_kind or found:
          backend = "xla_fusion" if not gemm_kind else "cudnn" if kind.group(1) == "__cudnn$fusion" else "triton"
          row = {"name": ins.name, "backend": backend, "out": ins.dtype}
          if found:
            dot, dcomp = found
            dtypes = {i.name: (i.dtype, i.dims) for i in dcomp.instrs}
            (lt, ld), (rt, rd) = (dtypes.get(o, ("?", ())) for o in dot.operands[:2])
            row |= {"lhs": lt, "rhs": rt, **_sizes(ld, rd, _dot_dims(dot.attrs))}
            if backend == "triton":
              tile, k_tile = triton_tile(ins.attrs), _contracting_tile(dot)
              row["tile"] = tile.replace(" ", f"x{k_tile} ", 1) if k_tile and tile.count("x") == 1 else tile
      elif ins.opcode == "custom-call":
        target = _TARGET_RE.search(ins.attrs)
        backend = CUSTOM_CALLS.get(target.group(1) if target else "")
        if backend:
          (lt, ld), (rt, rd) = (types.get(o, ("?", ())) for o in ins.operands[:2])
          out_type = hlo.array_types(ins.type_text)
          row = {"name": ins.name, "backend": backend, "lhs": lt, "rhs": rt, "out": out_type[0][0] if out_type else "?"}
          row |= _sizes(ld, rd, _config_dims(ins.attrs))
      elif ins.opcode == "dot" and comp.entry and len(ins.operands) >= 2:
        (lt, ld), (rt, rd) = (types.get(o, ("?", ())) for o in ins.operands[:2])
        row = {"name": ins.name, "backend": "dot", "lhs": lt, "rhs": rt, "out": ins.dtype}
        row |= _sizes(ld, rd, _dot_dims(ins.attrs))
      if row is not None:
        row.setdefault("tile", "")
        out.append(row)
  return out


def launches(text: str) -> int:
  """Fusions and custom calls of a module outside fusion bodies: the kernels (and library calls) it launches."""
  comps = hlo.parse_hlo(text)
  bodies = {
    c
    for comp in comps.values()
    for ins in comp.instrs
    if ins.opcode == "fusion"
    for c in hlo.CALLS_RE.findall(ins.attrs)
  }
  return sum(
    ins.opcode in ("fusion", "custom-call") for c in comps.values() if c.name not in bodies for ins in c.instrs
  )


def census(rows: list[dict]) -> dict[str, int]:
  """Counts of `gemms` rows by "backend lhs x rhs -> out"."""
  return dict(
    sorted(Counter(f"{r['backend']} {r.get('lhs', '?')} x {r.get('rhs', '?')} -> {r['out']}" for r in rows).items())
  )
