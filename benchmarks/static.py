"""`python -m benchmarks static`: costs read from the compiled program, no timing (deterministic, fast).

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

And for the SwiGLU FFN block (as in `python -m benchmarks ffn`) at the paper shapes: XLA's
`compiled.memory_analysis()` temp bytes (compile only, nothing is allocated or run). With
`--memory-breakdown`, also the buffers live where the program's memory peaks, read from XLA's
buffer assignment (`labtools.analysis.memory`): per recipe, their bytes by element type and the
largest temporaries with their shape and producing operation.
"""

from __future__ import annotations

import argparse

from benchmarks import options
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis import memory as memory_analysis
from labtools.analysis.elementwise import gradient_sized_ops
from labtools.analysis.hlo import hlo_text
from labtools.paper import PAPER_EXTRA_OPS
from labtools.results import RESULTS_DIR, Run, log, markdown_table, parse_list

DEFAULT_RECIPES = ",".join(options.BENCH_RECIPES)
DEFAULT_MEMORY_SHAPES = "all"
BREAKDOWN_ROWS = 12  # buffers live at the peak kept per recipe in the JSON (largest first)
BREAKDOWN_SHOWN = 6  # of which the Markdown lists the temporaries
LABELS = {"int8_sr": "independent SR", "s3r": "S3R", "s3r_ec": "S3R-EC"}  # names of the paper's rows


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
  args = (
    jax.ShapeDtypeStruct((tokens, k), jnp.bfloat16),
    jax.ShapeDtypeStruct((k, n), jnp.float32),
    jax.ShapeDtypeStruct((tokens, n), jnp.bfloat16),
    jax.random.key(0),
  )
  f = layer_fwd_bwd(recipe)
  jaxpr = jax.make_jaxpr(f)(*args)
  compiled = jax.jit(f).lower(*args).compile()
  ops = gradient_sized_ops(hlo_text(compiled), tokens * n)
  rnd = jaxpr_analysis.random_draws(jaxpr)
  mem = _memory(compiled)
  return {
    "recipe": recipe,
    "tokens": tokens,
    "k": k,
    "n": n,
    "ops": ops,
    "random": rnd,
    "int8_gradient_bytes": ops["written_bytes"].get("s8", 0),
    "f32_gradient_sized_bytes": ops["written_bytes"].get("f32", 0),
    "u32_gradient_sized_bytes": ops["written_bytes"].get("u32", 0),
    "memory": mem,
  }


def _memory(compiled) -> dict | None:
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements it
    return None
  if m is None:
    return None
  keys = (
    "temp_size_in_bytes",
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "generated_code_size_in_bytes",
  )
  return {k: int(getattr(m, k)) for k in keys if hasattr(m, k)}


def ffn_memory(recipe: str, tokens: int, hidden: int, ffn_dim: int, *, breakdown: bool = False) -> dict | None:
  """memory_analysis() of the FFN block fwd+bwd (compile only, from abstract shapes); with
  `breakdown`, also the buffers live at the peak (`labtools.analysis.memory`) under "breakdown"."""
  import jax
  import jax.numpy as jnp

  from benchmarks import ffn

  args = (
    jax.ShapeDtypeStruct((tokens, hidden), jnp.bfloat16),
    jax.ShapeDtypeStruct((hidden, ffn_dim), jnp.float32),
    jax.ShapeDtypeStruct((hidden, ffn_dim), jnp.float32),
    jax.ShapeDtypeStruct((ffn_dim, hidden), jnp.float32),
    jax.ShapeDtypeStruct((tokens, hidden), jnp.bfloat16),
    jax.random.key(0),
  )
  lowered = ffn.make_fwd_bwd(recipe).lower(*args)
  if not breakdown:
    return _memory(lowered.compile())
  found, compiled = memory_analysis.buffer_breakdown(lowered)
  mem = _memory(compiled)
  if mem is None:
    return None
  found["peak"] = found["peak"][:BREAKDOWN_ROWS]
  del found["temp_values"]
  return {**mem, "breakdown": found}


# --- command ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (default %(default)s)")
  p.add_argument("--tokens", type=int, default=1024, help="T of the one-layer analysis (default %(default)s)")
  p.add_argument(
    "--k", type=int, default=1536, help="K (input features) of the one-layer analysis (default %(default)s)"
  )
  p.add_argument(
    "--n", type=int, default=2048, help="N (output features) of the one-layer analysis (default %(default)s)"
  )
  p.add_argument(
    "--memory-shapes",
    default=DEFAULT_MEMORY_SHAPES,
    help="shapes (W1..W9, 'all', HxD) for the FFN memory_analysis, or 'none' (default %(default)s)",
  )
  p.add_argument(
    "--memory-tokens",
    type=int,
    default=None,
    help="tokens for the FFN memory analysis (default: the ffn bench's per-shape default)",
  )
  p.add_argument(
    "--memory-breakdown",
    action="store_true",
    help="also list the buffers live at the FFN's memory peak, from XLA's buffer assignment",
  )
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_static_<platform>.{json,md} go (default %(default)s)"
  )


def run(args: argparse.Namespace) -> dict:
  from s3r import RECIPES

  recipes = parse_list(args.recipes, list(RECIPES), "recipes")
  mshapes = {} if args.memory_shapes == "none" else options.parse_shapes(args.memory_shapes)
  run_ = Run(
    "static",
    args.out_dir,
    recipes=",".join(recipes),
    tokens=args.tokens,
    k=args.k,
    n=args.n,
    memory_shapes=",".join(mshapes),
    memory_tokens=args.memory_tokens,
    memory_breakdown=args.memory_breakdown,
  )
  layer = {}
  for r in recipes:
    log(f"[static] layer T={args.tokens} K={args.k} N={args.n}: {r}")
    layer[r] = analyze_layer(r, args.tokens, args.k, args.n)
  base = layer.get("int8_rtne")
  for r, res in layer.items():
    res["extra_ops_per_element_vs_int8_rtne"] = (
      res["ops"]["ops_per_element"] - base["ops"]["ops_per_element"] if base and RECIPES[r].quantized else None
    )
  memory = []
  for shape in mshapes:
    hidden, ffn_dim = mshapes[shape]
    tokens = options.tokens_for(shape, args.memory_tokens)
    row = {"shape": shape, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": tokens, "recipes": {}}
    for r in recipes:
      log(f"[static] FFN memory {shape} T={tokens}: {r}")
      row["recipes"][r] = ffn_memory(r, tokens, hidden, ffn_dim, breakdown=args.memory_breakdown)
    memory.append(row)
  results = {"layer": layer, "ffn_memory": memory}
  paths = run_.write(results, markdown(results, recipes))
  log(f"[static] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def markdown(results: dict, recipes: list[str]) -> str:
  layer = results["layer"]
  any_r = next(iter(layer.values()))
  t, k, n = any_r["tokens"], any_r["k"], any_r["n"]
  el = t * n
  out = [f"## One quantized layer x [{t}, {k}] @ w [{k}, {n}], forward + backward (compiled HLO, jaxpr)", ""]
  head = [
    "recipe",
    "ops/elem",
    "extra ops/elem vs int8_rtne",
    "[T,N]-shaped ops/elem",
    "random words",
    "words/elem",
    "int8 grad bytes/elem",
    "f32 [T,N] temps written (bytes/elem)",
    "u32 [T,N] written (bytes/elem)",
    "temp MiB (layer)",
  ]
  rows = []
  for r in recipes:
    res = layer[r]
    extra = res["extra_ops_per_element_vs_int8_rtne"]
    mem = res["memory"] or {}
    rows.append(
      [
        r,
        res["ops"]["ops_per_element"],
        "" if extra is None else f"{extra:+d}",
        res["ops"]["shape_only_ops_per_element"],
        res["random"]["words"],
        f"{res['random']['words'] / el:.4g}",
        f"{res['int8_gradient_bytes'] / el:g}",
        f"{res['f32_gradient_sized_bytes'] / el:g}",
        f"{res['u32_gradient_sized_bytes'] / el:g}",
        f"{mem.get('temp_size_in_bytes', float('nan')) / 2**20:.1f}",
      ]
    )
  out.append(markdown_table(head, rows))
  paper_ops = ", ".join(f"{LABELS[r]} {lo:+d}..{hi:+d}" for r, (lo, hi) in PAPER_EXTRA_OPS.items())
  out += [
    "",
    f"Paper (TPU v5p VPU ops over INT8 RTNE): {paper_ops}. "
    "Here: HLO instructions on [T, N]-sized arrays (method in `benchmarks/static.py`). "
    "Per-recipe opcode breakdown in the JSON.",
    "",
  ]
  out += ["### Opcodes of the [T, N]-sized ops (count per element, fwd+bwd)", ""]
  ops = sorted({o for r in recipes for o in layer[r]["ops"]["by_opcode"]})
  out.append(
    markdown_table(["opcode", *recipes], [[o, *[layer[r]["ops"]["by_opcode"].get(o, 0) for r in recipes]] for o in ops])
  )
  if results["ffn_memory"]:
    out += ["", "## SwiGLU FFN block fwd+bwd: XLA temp memory (compiled.memory_analysis(), MiB)", ""]
    rows = []
    for row in results["ffn_memory"]:
      base = (row["recipes"].get("int8_rtne") or {}).get("temp_size_in_bytes")
      cells = []
      for r in recipes:
        m = row["recipes"][r]
        v = None if m is None else m.get("temp_size_in_bytes")
        cells.append(
          "n/a" if v is None else (f"{v / 2**20:.1f}" + (f" ({v / base:.2f}x)" if base and r != "int8_rtne" else ""))
        )
      rows.append([row["shape"], row["tokens"], *cells])
    out.append(markdown_table(["shape", "T", *recipes], rows))
    out += ["", "(x): relative to int8_rtne.", ""]
    out += breakdown_markdown(results["ffn_memory"], recipes)
  return "\n".join(out)


def _op(p: dict) -> str:
  """The producing JAX operation without the outer jit name ("transpose(jvp())/mul": backward)."""
  return p["op_name"].split("/", 1)[-1] if p["op_name"] else p["opcode"]


def _mib(b: int) -> str:
  return f"{b / 2**20:.1f}"


def breakdown_markdown(rows: list[dict], recipes: list[str]) -> list[str]:
  """Per shape: the temporaries live at the memory peak, by element type, and the largest ones."""
  out = []
  for row in rows:
    found = {r: (row["recipes"][r] or {}).get("breakdown") for r in recipes}
    found = {r: b for r, b in found.items() if b}
    if not found:
      continue
    dtypes = sorted({d for b in found.values() for d in b["by_kind_dtype"].get("temp", {})})
    out += [
      f"### Buffers live at the memory peak: {row['shape']} (H={row['hidden']}, D={row['ffn_dim']}), T={row['tokens']}",
      "",
      "Temp allocation and the temporaries live at the peak step, MiB by element type (XLA buffer assignment"
      + (
        "; no live-range dump: every temp buffer, not only those live at the peak):"
        if any(b["peak_step"] is None for b in found.values())
        else "):"
      ),
      "",
    ]
    table = []
    for r, b in found.items():
      temp = b["by_kind_dtype"].get("temp", {})
      table.append([r, _mib(b["temp_bytes"]), _mib(sum(temp.values())), *[_mib(temp.get(d, 0)) for d in dtypes]])
    out.append(markdown_table(["recipe", "temp alloc", "live temps", *dtypes], table))
    out += ["", f"Largest temporaries live at the peak (up to {BREAKDOWN_SHOWN}; MiB, type, producing JAX op):", ""]
    table = []
    for r, b in found.items():
      temps = [p for p in b["peak"] if p["kind"] == "temp"][:BREAKDOWN_SHOWN]
      cells = [f"{_mib(p['bytes'])} {p['dtype']}{p['dims']} `{_op(p)}`" for p in temps]
      table.append([r, "<br>".join(cells)])
    out.append(markdown_table(["recipe", "buffers"], table, align=["l", "l"]))
    out.append("")
  return out
