"""What `python -m benchmarks aot` reads from a compiled GPU or TPU program, and its Markdown tables.

GEMM kinds in XLA:GPU's optimized HLO (`compiled.as_text()`):
- triton_gemm: a fusion whose backend config kind is `__triton_gemm` or `__triton_nested_gemm_fusion`
  (XLA's Triton GEMM emitter), counted by the element types of its dot's operands (e.g. "s8 x s8");
- cublas / cublaslt: custom calls `__cublas$gemm` and `__cublas$lt$matmul`; cublaslt_f8: cuBLASLt's FP8
  matmul `__cublas$lt$matmul$f8`, counted by its operand types (e.g. "f8e5m2 x f8e4m3fn");
- cudnn_gemm: a fusion of kind `__cudnn$fusion`; cudnn_attention: custom calls `__cudnn$fmha*`;
- pallas_triton: custom calls `__gpu$xla.gpu.triton` (Pallas kernels lowered through Triton);
- dot: a dot left outside any fusion.
Every GEMM is counted once per instruction of the program (a while loop's body once, not per trip).
A native FP8 GEMM (`fp8_gemms`) is a cublaslt_f8 call or a Triton GEMM whose dot takes two FP8 operands
(`f8e4m3fn`, `f8e5m2`): XLA:GPU runs both on the FP8 tensor cores (Hopper's wgmma with FP8 inputs).
An FP8 code emulated in a wider type shows up as a GEMM of that type (f32, bf16 or f16 operands).

GEMMs in XLA:TPU's optimized HLO (`tpu_gemm_kinds`): the TPU compiler writes every dot as a `convolution`
(or leaves a `dot`), most inside an output fusion; each is counted, in whatever computation it sits, by its
operand and result element types: "convolution s8 x s8 -> s32" is an int8 GEMM on the MXU with int32
accumulation, "convolution bf16 x bf16 -> f32" a bf16 one. "mosaic_kernel" counts the custom calls
`tpu_custom_call` (kernels compiled by Mosaic: Pallas TPU kernels, and the TPU lowering of `ragged_dot`,
which adds one that only computes its group metadata), GEMMs or not.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from labtools.analysis import hlo
from labtools.results import markdown_table

BREAKDOWN_ROWS = 12  # buffers live at the peak kept per program (largest first)
BREAKDOWN_SHOWN = 6  # of which the Markdown lists the temporaries
MIB = 2**20
_KIND_RE = re.compile(r'"kind":"(__[\w$]+)"')
_TARGET_RE = re.compile(r'custom_call_target="([^"]+)"')
FP8_TYPES = ("f8e4m3fn", "f8e5m2")  # the element types of the FP8 tensor-core GEMMs in HLO text


def memory(compiled) -> dict[str, int]:
  """memory_analysis() of one device in bytes: temp, argument, output, alias, generated code, and where the
  backend reports them, the peak of live bytes (`peak_memory_in_bytes`, arguments and outputs included) and
  the bytes of all allocations (`total_allocation_bytes`)."""
  m = compiled.memory_analysis()
  if m is None:
    return {}
  keys = ("temp", "argument", "output", "alias", "generated_code")
  out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in keys if hasattr(m, f"{k}_size_in_bytes")}
  for key, attr in (("peak", "peak_memory_in_bytes"), ("total_allocation", "total_allocation_bytes")):
    if isinstance(getattr(m, attr, None), int):
      out[key] = int(getattr(m, attr))
  return out


def _dot_operands(comps: dict, name: str) -> str | None:
  """ "a x b": the operand element types of the dot in fusion computation `name` (or one it calls)."""
  found = hlo.find_dot(comps, name)
  if found is None:
    return None
  dot, comp = found
  types = {i.name: i.dtype for i in comp.instrs}
  return " x ".join(str(types.get(o, "?")) for o in dot.operands[:2])


def gemm_kinds(text: str) -> dict[str, int]:
  """GEMMs of an optimized GPU HLO module by kind (see the module docstring)."""
  comps = hlo.parse_hlo(text)
  found: Counter[str] = Counter()
  for comp in comps.values():
    for ins in comp.instrs:
      if ins.opcode == "fusion":
        kind = _KIND_RE.search(ins.attrs)
        if kind and kind.group(1) in ("__triton_gemm", "__triton_nested_gemm_fusion"):
          callee = hlo.CALLS_RE.search(ins.attrs)
          operands = _dot_operands(comps, callee.group(1)) if callee else None
          found[f"triton_gemm {operands or '?'}"] += 1
        elif kind and kind.group(1) == "__cudnn$fusion":
          found["cudnn_gemm"] += 1
      elif ins.opcode == "custom-call":
        target = _TARGET_RE.search(ins.attrs)
        t = target.group(1) if target else ""
        if t == "__cublas$gemm":
          found["cublas"] += 1
        elif t == "__cublas$lt$matmul$f8":
          types = {i.name: i.dtype for i in comp.instrs}
          found[f"cublaslt_f8 {' x '.join(str(types.get(o, '?')) for o in ins.operands[:2])}"] += 1
        elif t.startswith("__cublas$lt$matmul"):
          found["cublaslt"] += 1
        elif t.startswith("__cudnn$fmha"):
          found["cudnn_attention"] += 1
        elif t == "__gpu$xla.gpu.triton":
          found["pallas_triton"] += 1
      elif ins.opcode == "dot" and comp.entry:
        found["dot"] += 1
  return dict(sorted(found.items()))


def tpu_gemm_kinds(text: str) -> dict[str, int]:
  """GEMMs of an optimized TPU HLO module by operand and result types (see the module docstring)."""
  found: Counter[str] = Counter()
  for comp in hlo.parse_hlo(text).values():
    types = {i.name: i.dtype for i in comp.instrs}
    for ins in comp.instrs:
      if ins.opcode in ("convolution", "dot") and len(ins.operands) >= 2:
        operands = " x ".join(str(types.get(o, "?")) for o in ins.operands[:2])
        found[f"{ins.opcode} {operands} -> {ins.dtype}"] += 1
      elif ins.opcode == "custom-call" and 'custom_call_target="tpu_custom_call"' in ins.attrs:
        found["mosaic_kernel"] += 1
  return dict(sorted(found.items()))


def fp8_gemms(gemms: dict[str, int]) -> int:
  """How many GEMMs of a `gemm_kinds` census are native FP8 GEMMs (see the module docstring)."""
  native = 0
  for kind, n in gemms.items():
    what, _, operands = kind.partition(" ")
    types = operands.split(" x ")
    if what in ("triton_gemm", "cublaslt_f8") and len(types) == 2 and all(t in FP8_TYPES for t in types):
      native += n
  return native


def hlo_summary(text: str, tpu: bool = False) -> dict:
  """GEMM kinds (of a GPU program, or of a TPU program: `tpu`), fusions by kind and instruction counts of the
  entry computation and the module."""
  comps = hlo.parse_hlo(text)
  entry = next((c for c in comps.values() if c.entry), None)
  fusions: Counter[str] = Counter()
  for comp in comps.values():
    for ins in comp.instrs:
      if ins.opcode == "fusion":
        kind = _KIND_RE.search(ins.attrs)
        fusions[kind.group(1) if kind else re.search(r"kind=(\w+)", ins.attrs).group(1)] += 1  # type: ignore[union-attr]
  gemms = tpu_gemm_kinds(text) if tpu else gemm_kinds(text)
  return {
    "gemms": gemms,
    "fp8_gemms": fp8_gemms(gemms),
    "fusions": dict(sorted(fusions.items())),
    "entry_instructions": len(entry.instrs) if entry else 0,
    "instructions": sum(len(c.instrs) for c in comps.values()),
    "lines": text.count("\n"),
  }


_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
_PASS_RE = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (\w+) ")
_TIMER_RE = re.compile(r"\] (GpuCompiler::\w+|NVPTXCompiler::\w+ - \w+)(?: for \S+)? time: ([\d.]+) (\w+) ")


def xla_timers(log: str, top: int = 10) -> dict:
  """XLA:GPU's compile timers from its logs (`--xla-timers`): seconds per phase, summed over its calls
  (RunHloPasses, RunBackend; CompileToPtx and PtxToCubin run once per kernel module, partly in parallel
  threads, so their sums can exceed the wall-clock time) and the `top` HLO passes by total seconds."""
  phases: defaultdict[str, float] = defaultdict(float)
  calls: Counter[str] = Counter()
  passes: defaultdict[str, float] = defaultdict(float)
  for line in log.splitlines():
    if m := _PASS_RE.search(line):
      passes[m.group(1)] += float(m.group(2)) * _UNITS.get(m.group(3), 0.0)
    elif m := _TIMER_RE.search(line):
      phases[m.group(1)] += float(m.group(2)) * _UNITS.get(m.group(3), 0.0)
      calls[m.group(1)] += 1
  return {
    "phases_s": {k: round(v, 3) for k, v in sorted(phases.items())},
    "phase_calls": dict(sorted(calls.items())),
    "hlo_passes_s": round(sum(passes.values()), 3),
    "top_passes_s": {k: round(v, 3) for k, v in sorted(passes.items(), key=lambda kv: -kv[1])[:top]},
  }


def gemm_text(gemms: dict[str, int]) -> str:
  return ", ".join(f"{n} {k}" for k, n in gemms.items()) or "none"


def one_line(row: dict) -> str:
  m = row["memory"]
  return f"temp {m.get('temp', 0) / MIB:.1f} MiB, GEMMs: {gemm_text(row['hlo']['gemms'])}"


def _mib(b: int | None) -> str:
  return "" if b is None else f"{b / MIB:,.1f}"


def _ratio(a: float, b: float | None) -> str:
  return "" if not b else f"{a / b:.2f}"


def _config(row: dict) -> str:
  if row["program"] == "ffn":
    return f"FFN {row['shape']} (H={row['hidden']}, D={row['ffn_dim']}), T={row['tokens']}"
  if row["program"] == "moe":
    return f"grouped GEMM `{row['impl']}`, T={row['tokens']}, K={row['k']}, N={row['n']}, E={row['experts']}"
  what = "train step" if row["program"] == "step" else "lockstep train step"
  layout = f", {row['layout']}" if row.get("layout") else ""
  accum = f" in {row['grad_accum']} microbatches" if row.get("grad_accum", 1) > 1 else ""
  return f"{what} {row['preset']} L={row['layers']}, {row['batch']} x {row['seq']}{accum}{layout}"


def markdown(rows: list[dict], device_kind: str, tpu: bool = False) -> str:
  """Per configuration: a row per recipe with compile seconds, memory and GEMM kinds, ratios to bf16."""
  if tpu:
    head_line = (
      f"Target: {device_kind} (libtpu's compile-only devices, one chip; no TPU was used). Times: wall-clock "
      "seconds on the compiling machine, and the CPU seconds of the compile (all threads)."
    )
  else:
    head_line = (
      f"Target: {device_kind} (compile-only devices; no GPU was used). Times: wall-clock seconds on the compiling "
      "machine, and the CPU seconds of the compile (all threads, and the ptxas processes XLA starts)."
    )
  out = [head_line, ""]
  configs: dict[str, list[dict]] = {}
  for row in rows:
    configs.setdefault(_config(row), []).append(row)
  head = [
    "recipe",
    "lower s",
    "compile s",
    "x bf16",
    "compile CPU s",
    "x bf16",
    "temp MiB",
    "x bf16",
    "args MiB",
    "out MiB",
    "GEMMs",
    "FP8 GEMMs",
    "fusions",
  ]
  for config, group in configs.items():
    base = next((r for r in group if r["recipe"] == "bf16" and "error" not in r), None)
    table = []
    for r in group:
      if "error" in r:
        table.append([r["recipe"], "", "failed", "", "", "", "", "", "", "", r["error"][:160], "", ""])
        continue
      m = r["memory"]
      table.append(
        [
          r["recipe"],
          f"{r['lower_s']:.1f}",
          f"{r['compile_s']:.1f}",
          _ratio(r["compile_s"], None if base is None else base["compile_s"]),
          f"{r['compile_cpu_s']:.1f}",
          _ratio(r["compile_cpu_s"], None if base is None else base["compile_cpu_s"]),
          _mib(m.get("temp")),
          _ratio(m.get("temp", 0), None if base is None else base["memory"].get("temp")),
          _mib(m.get("argument")),
          _mib(m.get("output")),
          gemm_text(r["hlo"]["gemms"]),
          r["hlo"].get("fp8_gemms", fp8_gemms(r["hlo"]["gemms"])),
          sum(r["hlo"]["fusions"].values()),
        ]
      )
    out += [f"## {config}", "", markdown_table(head, table), ""]
    out += _timers(group)
    out += _breakdown(group)
  return "\n".join(out + depth_table(rows))


def depth_ratios(rows: list[dict]) -> list[dict]:
  """Per program, preset, layout and recipe compiled at several depths: lower + compile seconds (wall, and
  CPU where measured) at the shallowest and the deepest depth, and deepest / shallowest."""
  groups: dict[tuple, dict[int, dict]] = {}
  for r in rows:
    if r["program"] in ("step", "lockstep") and "error" not in r:
      key = (r["program"], r["preset"], r.get("layout", "scan"), r["recipe"])
      groups.setdefault(key, {})[r["layers"]] = r
  out = []
  for (program, preset, layout, recipe), by in groups.items():
    if len(by) < 2:
      continue
    lo, hi = by[min(by)], by[max(by)]
    wall = lambda r: r["lower_s"] + r["compile_s"]
    cpu = lambda r: r.get("lower_cpu_s", float("nan")) + r["compile_cpu_s"]
    row = {"program": program, "preset": preset, "layout": layout, "recipe": recipe}
    row |= {"shallow": min(by), "deep": max(by), "wall_s": [wall(lo), wall(hi)], "cpu_s": [cpu(lo), cpu(hi)]}
    row |= {"wall_ratio": wall(hi) / wall(lo), "cpu_ratio": cpu(hi) / cpu(lo)}
    out.append(row)
  return out


def depth_table(rows: list[dict], target: float = 1.25) -> list[str]:
  found = depth_ratios(rows)
  if not found:
    return []
  out = [
    "## Compile time against depth",
    "",
    f"Lower + compile seconds at the shallowest and the deepest depth (wall clock; CPU: this process's threads and "
    f"ptxas), and deepest / shallowest (the scanned decoder's target: at most {target}).",
    "",
  ]
  table = []
  for d in found:
    table.append(
      [
        f"{d['program']} {d['preset']}, {d['layout']}",
        d["recipe"],
        f"{d['wall_s'][0]:.1f}",
        f"{d['wall_s'][1]:.1f}",
        f"{d['wall_ratio']:.2f}",
        f"{d['cpu_s'][0]:.1f}",
        f"{d['cpu_s'][1]:.1f}",
        f"{d['cpu_ratio']:.2f}",
        "yes" if max(d["wall_ratio"], d["cpu_ratio"]) <= target else "no",
      ]
    )
  lo, hi = found[0]["shallow"], found[0]["deep"]
  head = ["program", "recipe", f"wall L={lo}", f"wall L={hi}", "wall ratio", f"CPU L={lo}", f"CPU L={hi}"]
  head += ["CPU ratio", f"both <= {target}"]
  return [*out, markdown_table(head, table), ""]


def _timers(group: list[dict]) -> list[str]:
  rows = [r for r in group if r.get("xla_timers")]
  if not rows:
    return []
  out = [
    "XLA's compile timers (seconds summed over calls; PTX and ptxas run per kernel module, partly in parallel):",
    "",
  ]
  table = []
  for r in rows:
    t = r["xla_timers"]
    ph = t["phases_s"]
    key = "NVPTXCompiler::CompileTargetBinary - "
    top = ", ".join(f"{k} {v:.2f}" for k, v in list(t["top_passes_s"].items())[:3])
    table.append(
      [
        r["recipe"],
        f"{ph.get('GpuCompiler::RunHloPasses', 0):.2f}",
        top,
        f"{ph.get('GpuCompiler::RunBackend', 0):.2f}",
        t["phase_calls"].get(key + "CompileToPtx", 0),
        f"{ph.get(key + 'CompileToPtx', 0):.2f}",
        f"{ph.get(key + 'PtxToCubin', 0):.2f}",
      ]
    )
  head = ["recipe", "HLO passes", "largest passes", "backend", "kernel modules", "LLVM to PTX", "ptxas"]
  return [*out, markdown_table(head, table, align=["l", "r", "l", "r", "r", "r", "r"]), ""]


def _breakdown(group: list[dict]) -> list[str]:
  found = {r["recipe"]: r["breakdown"] for r in group if r.get("breakdown")}
  if not found:
    return []
  dtypes = sorted({d for b in found.values() for d in b["by_kind_dtype"].get("temp", {})})
  out = ["Temporaries live at the memory peak, MiB by element type (XLA buffer assignment):", ""]
  table = []
  for r, b in found.items():
    temp = b["by_kind_dtype"].get("temp", {})
    table.append([r, _mib(b["temp_bytes"]), _mib(sum(temp.values())), *[_mib(temp.get(d, 0)) for d in dtypes]])
  out += [markdown_table(["recipe", "temp alloc", "live temps", *dtypes], table), ""]
  out += [f"Largest temporaries live at the peak (up to {BREAKDOWN_SHOWN}; MiB, type, producing JAX op):", ""]
  table = []
  for r, b in found.items():
    temps = [p for p in b["peak"] if p["kind"] == "temp"][:BREAKDOWN_SHOWN]
    op = lambda p: p["op_name"].split("/", 1)[-1] if p["op_name"] else p["opcode"]
    table.append([r, "<br>".join(f"{_mib(p['bytes'])} {p['dtype']}{p['dims']} `{op(p)}`" for p in temps)])
  out += [markdown_table(["recipe", "buffers"], table, align=["l", "l"]), ""]
  return out + _heap(found)


def _gap(gap: dict | None) -> str:
  if not gap:
    return ""
  above = ", ".join(f"{x['type']} {_mib(x['bytes'])}, steps {x['start']}-{x['end']}" for x in gap["above"])
  return f"{_mib(gap['bytes'])} at {_mib(gap['offset'])} ({above})"


def _heap(found: dict[str, dict]) -> list[str]:
  """Per recipe, the largest temp allocation laid out over offset and program step (`labtools.analysis.heap`)."""
  rows = {r: b["heap"][0] for r, b in found.items() if b.get("heap")}
  if not rows:
    return []
  block = lambda x: f"{x['type']} {_mib(x['bytes'])} at {_mib(x['offset'])}, steps {x['start']}-{x['end']}"
  table = []
  for r, h in rows.items():
    top = h["top"]
    table.append(
      [
        r,
        _mib(h["bytes"]),
        f"{_mib(h['live_peak_bytes'])} (step {h['live_peak_step']})",
        _mib(h["bytes"] - h["live_peak_bytes"]),
        block(top) if top else "",
        _mib(h["live_most_during_top_bytes"]),
        "<br>".join(block(u) for u in h["under_top"]),
        _gap(h.get("largest_gap_below_top")),
      ]
    )
  head = ["recipe", "allocation", "live at most", "unfilled", "buffer ending highest", "live during it"]
  head += ["below it then", "largest span free all that time (bounded above by)"]
  return [
    "The largest temp allocation over offset and time (MiB; steps of XLA's program order; a buffer of at least",
    "1/64 of the allocation that ends highest sets its size, above it only smaller ones):",
    "",
    markdown_table(head, table, align=["l", "r", "r", "r", "l", "r", "l", "l"]),
    "",
  ]
