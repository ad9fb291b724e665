"""`s3r bench static`: costs read from the compiled program, no timing (deterministic, fast).

Per recipe, for one quantized linear layer x [T, K] @ w [K, N] forward + backward
(dimensions chosen pairwise distinct so that a [T, N] gradient-sized array is unambiguous):

- ops/elem: elementwise HLO instructions per upstream-gradient element. Method: parse the
  optimized HLO (`jit(...).lower(...).compile().as_text()`); give every computation its
  execution count (1 for ENTRY, x known_trip_count for while bodies, e.g. Threefry's rolled
  rounds); count, times its execution count, every elementwise instruction (arithmetic,
  logical, shift, compare, select, clamp, convert, round, iota, ...) that runs once per
  gradient element: all of those inside a loop fusion whose output has T*N elements (the
  fusion evaluates its whole body per output element, so a per-token threshold computed
  inside it is recomputed per element), and elsewhere those whose result has T*N elements;
  add one per reduce whose operand has T*N elements (a max or sum costs one op per element
  it reads). The count of only the instructions whose own result has T*N elements is kept
  as `shape_only_ops_per_element`. Data movement (broadcast, bitcast, reshape, copy, transpose, slice), parameters,
  constants and GEMMs are not counted. The same count for `int8_rtne` (forward rescale,
  scale folding, Δ, rounding) is subtracted: `extra ops/elem` is what the recipe adds over
  round-to-nearest, the quantity of the paper (120-133 for independent SR, -2..+6 for S3R,
  15-23 for S3R-EC), measured here in HLO instructions rather than TPU VPU operations.
- random words: 32-bit words drawn, from the jaxpr of the forward + backward
  (`random_bits` of shape s and width b draws prod(s)*b/32 words; raw `threefry2x32` calls
  produce two words per element). Key derivations (`random_split`, `random_fold_in`) are
  listed separately.
- int8 gradient bytes: bytes of s8 arrays with T*N elements written by top-level
  instructions (fusion outputs, not fused intermediates), i.e. the codes Q the backward GEMMs
  read; also the bytes of f32/u32 arrays of T*N elements that are materialized (temporaries a
  fully fused quantizer would not write).

And for the SwiGLU FFN block (as in `s3r bench ffn`) at the paper shapes: XLA's
`compiled.memory_analysis()` temp bytes (compile only, nothing is allocated or run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from collections import Counter, defaultdict

from s3r.bench import common

DEFAULT_RECIPES = ",".join(common.BENCH_RECIPES)
DEFAULT_MEMORY_SHAPES = "all"

ELEMENTWISE = frozenset("""
add subtract multiply divide remainder power atan2 and or xor not shift-left shift-right-logical
shift-right-arithmetic maximum minimum abs negate sign floor ceil round-nearest-even round-nearest-afz
convert bitcast-convert compare select clamp exponential exponential-minus-one log log-plus-one sqrt rsqrt
cbrt tanh logistic sine cosine tan erf is-finite popcnt count-leading-zeros clz iota reduce-precision
real imag
""".split())
REDUCES = frozenset(["reduce", "reduce-window"])
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8}


# --- HLO text parsing ------------------------------------------------------------------------


@dataclasses.dataclass
class Instr:
  name: str
  opcode: str
  dtype: str | None  # None for tuples
  dims: tuple[int, ...]
  operands: list[str]
  attrs: str

  @property
  def elements(self) -> int:
    return math.prod(self.dims) if self.dtype is not None else 0


@dataclasses.dataclass
class Computation:
  name: str
  entry: bool
  instrs: list[Instr]


_COMP_RE = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s+\(.*->.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_SHAPE_RE = re.compile(r"^(\w+)\[([\d,]*)\]")


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


def parse_hlo(text: str) -> dict[str, Computation]:
  """Computations of an HLO module's text (as printed by `compiled.as_text()`)."""
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  comps: dict[str, Computation] = {}
  cur = None
  for line in text.splitlines():
    if cur is None:
      m = _COMP_RE.match(line)
      if m:
        cur = Computation(m.group(2), bool(m.group(1)), [])
        comps[cur.name] = cur
      continue
    if line.startswith("}"):
      cur = None
      continue
    m = _INSTR_RE.match(line)
    if not m:
      continue
    name, rest = m.group(1), m.group(2)
    if rest.startswith("("):  # tuple shape
      end = _matching(rest, 0)
      dtype, dims, rest = None, (), rest[end + 1:].lstrip()
    else:
      sm = _SHAPE_RE.match(rest)
      if not sm:
        continue
      dtype = sm.group(1)
      dims = tuple(int(d) for d in sm.group(2).split(",") if d)
      rest = rest[sm.end():]
      rest = rest[rest.index(" ") + 1:] if " " in rest else ""
    paren = rest.find("(")
    if paren < 0:
      continue
    opcode = rest[:paren].strip()
    end = _matching(rest, paren)
    operands = re.findall(r"%([\w.\-]+)", rest[paren:end + 1])
    comps[cur.name].instrs.append(Instr(name, opcode, dtype, dims, operands, rest[end + 1:]))
  return comps


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
      for key, callee in re.findall(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)",
                                    ins.attrs):
        if key == "to_apply" and ins.opcode != "call":
          continue  # reducer/comparator regions run per element on scalars: not counted
        calls[c.name].append((callee, trip))
        if key == "calls" and ins.opcode == "fusion":
          fused.add(callee)
      m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
      if m:
        for callee in re.findall(r"%([\w.\-]+)", m.group(1)):
          calls[c.name].append((callee, 1))
  counts: dict[str, int] = defaultdict(int)
  entry = [c.name for c in comps.values() if c.entry]

  def visit(name: str, mult: int, depth: int = 0):
    if depth > 64:
      return
    counts[name] += mult
    for callee, trip in calls.get(name, ()):
      visit(callee, mult * trip, depth + 1)

  for e in entry:
    visit(e, 1)
  return dict(counts), fused


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
        n_in = sum(1 for o in ins.operands[: max(1, len(ins.operands) // 2)]
                   if o in shapes and shapes[o].elements == elements)
        if n_in:
          by_op[ins.opcode] += mult * n_in
          shape_only += mult * n_in
      if c.name not in fused and ins.elements == elements and ins.opcode not in (
          "parameter", "constant", "bitcast", "reshape", "get-tuple-element", "tuple", "broadcast"):
        written[ins.dtype] += mult * elements * DTYPE_BYTES.get(ins.dtype, 4)
        writers.append({"computation": c.name, "name": ins.name, "opcode": ins.opcode, "dtype": ins.dtype,
                        "dims": list(ins.dims), "executions": mult})
  ew = sum(v for k, v in by_op.items() if k in ELEMENTWISE)
  red = sum(v for k, v in by_op.items() if k in REDUCES)
  return {"elementwise": ew, "reduce": red, "ops_per_element": ew + red, "by_opcode": dict(sorted(by_op.items())),
          "shape_only_ops_per_element": shape_only, "written_bytes": dict(written), "writers": writers}


# --- jaxpr: random words ---------------------------------------------------------------------


def _sub_jaxprs(params):
  for v in params.values():
    for item in (v if isinstance(v, (tuple, list)) else (v,)):
      if hasattr(item, "eqns"):
        yield item
      elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
        yield item.jaxpr


def random_draws(jaxpr) -> dict:
  """32-bit random words drawn by a (closed) jaxpr, recursing into sub-jaxprs (scan x length)."""
  jaxpr = jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") and not hasattr(jaxpr, "eqns") else jaxpr
  words, draws, keys = 0, [], 0

  def visit(j, mult):
    nonlocal words, keys
    for eqn in j.eqns:
      name = eqn.primitive.name
      if name == "random_bits":
        shape = tuple(eqn.params["shape"])
        n = math.ceil(math.prod(shape) * eqn.params["bit_width"] / 32) * mult
        words += n
        draws.append({"primitive": name, "shape": list(shape), "bit_width": eqn.params["bit_width"], "words": n})
      elif name == "threefry2x32":
        n = 2 * math.prod(eqn.outvars[0].aval.shape) * mult
        words += n
        draws.append({"primitive": name, "shape": list(eqn.outvars[0].aval.shape), "words": n})
      elif name in ("random_split", "random_fold_in"):
        keys += math.prod(eqn.outvars[0].aval.shape) * mult
      inner = mult * (eqn.params.get("length", 1) if name == "scan" else 1)
      for sub in _sub_jaxprs(eqn.params):
        visit(sub, inner)

  visit(jaxpr, 1)
  return {"words": words, "draws": draws, "derived_keys": keys}


# --- per-recipe analysis of one layer --------------------------------------------------------


def layer_fwd_bwd(recipe: str):
  import jax
  from s3r import qmatmul

  def f(x, w, dy, key):
    _, vjp = jax.vjp(lambda x, w: qmatmul(x, w, key=key, recipe=recipe), x, w)
    return vjp(dy)

  return f


def analyze_layer(recipe: str, tokens: int, k: int, n: int) -> dict:
  """Static costs of one qmatmul layer x [T, K] @ w [K, N], forward + backward."""
  import jax
  import jax.numpy as jnp
  if len({tokens * n, tokens * k, k * n}) < 3:
    raise ValueError(f"T*N must differ from T*K and K*N to identify gradient-sized arrays; got T={tokens} K={k} N={n}")
  args = (jax.ShapeDtypeStruct((tokens, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.float32),
          jax.ShapeDtypeStruct((tokens, n), jnp.bfloat16), jax.random.key(0))
  f = layer_fwd_bwd(recipe)
  jaxpr = jax.make_jaxpr(f)(*args)
  compiled = jax.jit(f).lower(*args).compile()
  ops = gradient_sized_ops(compiled.as_text(), tokens * n)
  rnd = random_draws(jaxpr)
  mem = _memory(compiled)
  return {"recipe": recipe, "tokens": tokens, "k": k, "n": n, "ops": ops, "random": rnd,
          "int8_gradient_bytes": ops["written_bytes"].get("s8", 0),
          "f32_gradient_sized_bytes": ops["written_bytes"].get("f32", 0),
          "u32_gradient_sized_bytes": ops["written_bytes"].get("u32", 0),
          "memory": mem}


def _memory(compiled) -> dict | None:
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements it
    return None
  if m is None:
    return None
  keys = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "generated_code_size_in_bytes")
  return {k: int(getattr(m, k)) for k in keys if hasattr(m, k)}


def ffn_memory(recipe: str, tokens: int, hidden: int, ffn_dim: int) -> dict | None:
  """memory_analysis() of the FFN block fwd+bwd (compile only, from abstract shapes)."""
  import jax
  import jax.numpy as jnp
  from s3r.bench import ffn
  args = (jax.ShapeDtypeStruct((tokens, hidden), jnp.bfloat16), jax.ShapeDtypeStruct((hidden, ffn_dim), jnp.float32),
          jax.ShapeDtypeStruct((hidden, ffn_dim), jnp.float32), jax.ShapeDtypeStruct((ffn_dim, hidden), jnp.float32),
          jax.ShapeDtypeStruct((tokens, hidden), jnp.bfloat16), jax.random.key(0))
  return _memory(ffn.make_fwd_bwd(recipe).lower(*args).compile())


# --- command ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (default %(default)s)")
  p.add_argument("--tokens", type=int, default=1024, help="T of the one-layer analysis (default %(default)s)")
  p.add_argument("--k", type=int, default=1536, help="K (input features) of the one-layer analysis (default %(default)s)")
  p.add_argument("--n", type=int, default=2048, help="N (output features) of the one-layer analysis (default %(default)s)")
  p.add_argument("--memory-shapes", default=DEFAULT_MEMORY_SHAPES,
                 help="shapes (W1..W9, 'all', HxD) for the FFN memory_analysis, or 'none' (default %(default)s)")
  p.add_argument("--memory-tokens", type=int, default=None,
                 help="tokens for the FFN memory analysis (default: the ffn bench's per-shape default)")
  p.add_argument("--out-dir", default=str(common.RESULTS_DIR),
                 help="where bench_static_<platform>.{json,md} go (default %(default)s)")


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES
  recipes = common.parse_list(args.recipes, list(RECIPES), "recipes")
  mshapes = {} if args.memory_shapes == "none" else common.parse_shapes(args.memory_shapes)
  run_ = common.Run("static", args.out_dir, recipes=",".join(recipes), tokens=args.tokens, k=args.k, n=args.n,
                    memory_shapes=",".join(mshapes), memory_tokens=args.memory_tokens)
  layer = {}
  for r in recipes:
    common.log(f"[static] layer T={args.tokens} K={args.k} N={args.n}: {r}")
    layer[r] = analyze_layer(r, args.tokens, args.k, args.n)
  base = layer.get("int8_rtne")
  for r, res in layer.items():
    res["extra_ops_per_element_vs_int8_rtne"] = (res["ops"]["ops_per_element"] - base["ops"]["ops_per_element"]
                                                 if base and RECIPES[r].quantized else None)
  memory = []
  for shape in mshapes:
    hidden, ffn_dim = mshapes[shape]
    tokens = common.tokens_for(shape, args.memory_tokens)
    row = {"shape": shape, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": tokens, "recipes": {}}
    for r in recipes:
      common.log(f"[static] FFN memory {shape} T={tokens}: {r}")
      row["recipes"][r] = ffn_memory(r, tokens, hidden, ffn_dim)
    memory.append(row)
  results = {"layer": layer, "ffn_memory": memory}
  paths = run_.write(results, markdown(results, recipes))
  common.log(f"[static] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def markdown(results: dict, recipes: list[str]) -> str:
  layer = results["layer"]
  any_r = next(iter(layer.values()))
  t, k, n = any_r["tokens"], any_r["k"], any_r["n"]
  el = t * n
  out = [f"## One quantized layer x [{t}, {k}] @ w [{k}, {n}], forward + backward (compiled HLO, jaxpr)", ""]
  head = ["recipe", "ops/elem", "extra ops/elem vs int8_rtne", "[T,N]-shaped ops/elem", "random words", "words/elem",
          "int8 grad bytes/elem", "f32 [T,N] temps written (bytes/elem)", "u32 [T,N] written (bytes/elem)",
          "temp MiB (layer)"]
  rows = []
  for r in recipes:
    res = layer[r]
    extra = res["extra_ops_per_element_vs_int8_rtne"]
    mem = res["memory"] or {}
    rows.append([r, res["ops"]["ops_per_element"], "" if extra is None else f"{extra:+d}",
                 res["ops"]["shape_only_ops_per_element"], res["random"]["words"],
                 f"{res['random']['words'] / el:.4g}", f"{res['int8_gradient_bytes'] / el:g}",
                 f"{res['f32_gradient_sized_bytes'] / el:g}", f"{res['u32_gradient_sized_bytes'] / el:g}",
                 f"{mem.get('temp_size_in_bytes', float('nan')) / 2**20:.1f}"])
  out.append(common.markdown_table(head, rows))
  out += ["", "Paper (TPU v5p VPU ops over INT8 RTNE): independent SR +120..133, S3R -2..+6, S3R-EC +15..23. "
          "Here: HLO instructions on [T, N]-sized arrays (method in `s3r/bench/static.py`). "
          "Per-recipe opcode breakdown in the JSON.", ""]
  out += ["### Opcodes of the [T, N]-sized ops (count per element, fwd+bwd)", ""]
  ops = sorted({o for r in recipes for o in layer[r]["ops"]["by_opcode"]})
  out.append(common.markdown_table(["opcode", *recipes], [[o, *[layer[r]["ops"]["by_opcode"].get(o, 0) for r in recipes]]
                                                           for o in ops]))
  if results["ffn_memory"]:
    out += ["", "## SwiGLU FFN block fwd+bwd: XLA temp memory (compiled.memory_analysis(), MiB)", ""]
    rows = []
    for row in results["ffn_memory"]:
      base = (row["recipes"].get("int8_rtne") or {}).get("temp_size_in_bytes")
      cells = []
      for r in recipes:
        m = row["recipes"][r]
        v = None if m is None else m.get("temp_size_in_bytes")
        cells.append("n/a" if v is None else (f"{v / 2**20:.1f}" + (f" ({v / base:.2f}x)" if base and r != "int8_rtne" else "")))
      rows.append([row["shape"], row["tokens"], *cells])
    out.append(common.markdown_table(["shape", "T", *recipes], rows))
    out += ["", "(x): relative to int8_rtne.", ""]
  return "\n".join(out)


def dumps(results) -> str:
  return json.dumps(results, indent=1)
