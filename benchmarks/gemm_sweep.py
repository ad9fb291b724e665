"""`python -m benchmarks gemm_sweep`: the three GEMMs of the FFN's projections, alone, per operand type and shape.

For each paper shape W (H, D_ffn) and T tokens, the GEMMs of one projection x [T, H] @ w [H, D_ffn] as the
training step runs them, each laid out as autodiff leaves its operands (no copies made by hand):
  fwd: x [T, H] . w [H, D]     contracting H  (m = T, n = D, k = H)
  dx:  g [T, D] . w [H, D]     contracting D  (m = T, n = H, k = D)
  dw:  x [T, H] . g [T, D]     contracting T  (m = H, n = D, k = T)
at each operand type of `--dtypes`: bf16 (bf16 x bf16 -> f32), s8 (s8 x s8 -> s32), e4m3 (e4m3 x e4m3 -> f32) and
e4m3xe5m2 (e4m3 x e5m2 -> f32). Each GEMM is its own jitted program; what XLA runs for it (Triton GEMM fusion
with its tile, cuBLAS or cuBLASLt, and any other kernel XLA adds, such as a transpose of an int8 operand into
the layout cuBLASLt's int8 GEMM needs) is read from the optimized HLO (`benchmarks.gemm_backends`) and kept
beside its time. The time is of the whole program, those extra kernels included.

Timing (on a GPU): the GEMMs of one shape are compiled and warmed up, then timed interleaved
(`benchmarks.timing`), each sample the mean of `--number` back-to-back calls; the median and the IQR are
reported, and the rate in T(FL)OP/s (2mnk per call). The results are rewritten after every shape and the
run stops starting shapes after `--budget` seconds, so a run cut short keeps what it finished.

`--target h100|h200` compiles the same programs deviceless (no GPU, the `gpu-aot` extra, as
`python -m benchmarks aot`) and records only what XLA chose for each GEMM, with XLA's default tile
configurations (no autotuning without a GPU). `--xla NAME=VALUE` passes an XLA option to every compile
(e.g. `xla_gpu_enable_triton_gemm=false`: the GEMMs on cuBLAS / cuBLASLt).
Results: `<out-dir>/bench_gemm_sweep[_<tag>]_<platform>.{json,md}`.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import gemm_backends, options, timing
from labtools.results import RESULTS_DIR, Run, log, markdown_table, parse_list

DTYPES = ("bf16", "s8", "e4m3", "e4m3xe5m2")
GEMMS = ("fwd", "dx", "dw")
# operand types and the product's type per --dtypes entry (jax.numpy names)
_TYPES = {
  "bf16": ("bfloat16", "bfloat16", "float32"),
  "s8": ("int8", "int8", "int32"),
  "e4m3": ("float8_e4m3fn", "float8_e4m3fn", "float32"),
  "e4m3xe5m2": ("float8_e4m3fn", "float8_e5m2", "float32"),
}
# (lhs shape, rhs shape, lhs contracting dim, rhs contracting dim) from T, H, D
_LAYOUTS = {
  "fwd": lambda t, h, d: ((t, h), (h, d), 1, 0),
  "dx": lambda t, h, d: ((t, d), (h, d), 1, 1),
  "dw": lambda t, h, d: ((t, h), (t, d), 0, 0),
}


def sizes(gemm: str, tokens: int, hidden: int, ffn_dim: int) -> tuple[int, int, int]:
  """(m, n, k) of one of the three GEMMs."""
  return {"fwd": (tokens, ffn_dim, hidden), "dx": (tokens, hidden, ffn_dim), "dw": (hidden, ffn_dim, tokens)}[gemm]


def gemm_fn(dtype: str, gemm: str):
  """(fn(a, b), lhs type, rhs type) of one GEMM: a dot_general with the product's type preferred."""
  import jax
  import jax.numpy as jnp

  lhs, rhs, out = (getattr(jnp, name) for name in _TYPES[dtype])
  lc, rc = {"fwd": (1, 0), "dx": (1, 1), "dw": (0, 0)}[gemm]

  def fn(a, b):
    return jax.lax.dot_general(a, b, (((lc,), (rc,)), ((), ())), preferred_element_type=out)

  return fn, lhs, rhs


def operands(dtype: str, gemm: str, tokens: int, hidden: int, ffn_dim: int, make):
  """(a, b) of one GEMM, built by make(shape, jnp dtype) (random arrays, or abstract ones for a target)."""
  _, lhs, rhs = gemm_fn(dtype, gemm)
  a_shape, b_shape, _, _ = _LAYOUTS[gemm](tokens, hidden, ffn_dim)
  return make(a_shape, lhs), make(b_shape, rhs)


def random_maker(seed: int):
  """make(shape, dtype): random values in the type's range (int8 codes in [-127, 127], floats ~ N(0, 1))."""
  import jax
  import jax.numpy as jnp

  key = [jax.random.key(seed)]

  def make(shape, dtype):
    key[0], sub = jax.random.split(key[0])
    if jnp.issubdtype(dtype, jnp.integer):
      return jax.random.randint(sub, shape, -127, 128, jnp.int32).astype(dtype)
    return jax.random.normal(sub, shape, jnp.float32).astype(dtype)

  return make


def compile_gemm(dtype: str, gemm: str, args, compiler_options: dict):
  """The compiled program of one GEMM for `args` (arrays or abstract values) and its GEMM rows and kernel count."""
  import jax

  fn, _, _ = gemm_fn(dtype, gemm)
  compiled = jax.jit(fn).lower(*args).compile(compiler_options=compiler_options or None)
  text = compiled.as_text() or ""
  rows = gemm_backends.gemms(text)
  kernels = gemm_backends.launches(text)
  return compiled, rows, kernels


def describe(rows: list[dict]) -> tuple[str, str]:
  """(backend, tile) of a one-GEMM program: its GEMM rows joined (normally one)."""
  backend = "+".join(f"{r['backend']}" for r in rows) or "none"
  return backend, "+".join(r["tile"] for r in rows if r["tile"])


def sweep_shape(label, hidden, ffn_dim, args, opts, make, timed: bool) -> list[dict]:
  """Rows of every (dtype, gemm) of one shape: what XLA chose and, if `timed`, the seconds per call."""
  rows, configs = [], {}
  for dtype in parse_list(args.dtypes, list(DTYPES), "dtypes"):
    for gemm in parse_list(args.gemms, list(GEMMS), "gemms"):
      m, n, k = sizes(gemm, args.tokens, hidden, ffn_dim)
      row = {"dtype": dtype, "shape": label, "gemm": gemm, "m": m, "n": n, "k": k}
      t0 = time.perf_counter()
      try:
        a, b = operands(dtype, gemm, args.tokens, hidden, ffn_dim, make)
        compiled, found, kernels = compile_gemm(dtype, gemm, (a, b), opts)
      except Exception as e:  # an operand type the target refuses is a result too
        row["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        log(f"[gemm_sweep] {label} {dtype} {gemm}: FAILED {row['error']}")
        rows.append(row)
        continue
      backend, tile = describe(found)
      row |= {"backend": backend, "tile": tile, "kernels": kernels, "compile_s": time.perf_counter() - t0}
      row["lhs"], row["rhs"], row["out"] = (
        (found[0].get(t, "?") for t in ("lhs", "rhs", "out")) if found else ("?",) * 3
      )
      rows.append(row)
      if timed:
        configs[f"{dtype} {gemm}"] = (compiled, (a, b))
  if timed and configs:
    timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=1, number=args.number, seed=args.seed)
    for row in rows:
      t = timings.get(f"{row['dtype']} {row['gemm']}")
      if t is not None:
        row |= {"seconds": t.median, "iqr_s": t.iqr, "samples_s": t.samples}
        row["tops"] = 2 * row["m"] * row["n"] * row["k"] / t.median / 1e12
  return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--shapes", default="all", help="paper shapes W1..W9, 'all' or HxD (default %(default)s)")
  p.add_argument("--tokens", type=int, default=16384, help="tokens T (default %(default)s)")
  p.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {', '.join(DTYPES)}")
  p.add_argument("--gemms", default=",".join(GEMMS), help=f"comma-separated, of {', '.join(GEMMS)}")
  p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default %(default)s)")
  p.add_argument("--number", type=int, default=10, help="back-to-back calls per sample (default %(default)s)")
  p.add_argument("--budget", type=float, default=None, help="seconds after which no new shape starts")
  p.add_argument("--target", default=None, help="compile deviceless for h100, h200 or a GpuTargetConfigProto file")
  p.add_argument("--xla", action="append", metavar="NAME=VALUE", help="an XLA option for every compile (repeatable)")
  p.add_argument("--seed", type=int, default=0, help="seed of the operands and of the timing order")
  p.add_argument("--tag", default=None, help="results go to bench_gemm_sweep_<tag>_<platform>.*")
  p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the results files go (default %(default)s)")


def _setup(args: argparse.Namespace):
  """(compiler options, make(shape, dtype), timed, device kind) for a GPU run or a deviceless compile."""
  from benchmarks import aot

  if args.target is None:
    import jax

    opts = aot.compiler_options(args.xla)
    opts.pop("xla_gpu_autotune_level", None)  # a device autotunes as it would by default
    if jax.devices()[0].platform != "gpu":
      opts = {}  # XLA:CPU takes no XLA:GPU option (the dry runs)
    return opts, random_maker(args.seed), True, jax.devices()[0].device_kind
  if not aot.cuda_plugin_installed():
    raise SystemExit(aot.MISSING_EXTRA)
  aot.use_cpu_host()
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  devices = aot.target_devices(args.target)
  replicated = NamedSharding(aot.target_mesh(devices), P())
  make = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  return aot.compiler_options(args.xla), make, False, devices[0].device_kind


def run(args: argparse.Namespace) -> dict:
  opts, make, timed, kind = _setup(args)
  name = "gemm_sweep" + (f"_{args.tag}" if args.tag else "")
  settings = {k: getattr(args, k) for k in ("shapes", "tokens", "dtypes", "gemms", "repeats", "number", "target")}
  title = "python -m benchmarks gemm_sweep"
  run_ = Run(name, args.out_dir, title=title, device_kind=kind, compiler_options=opts, **settings)
  shapes = options.parse_shapes(args.shapes)
  rows: list[dict] = []
  paths: dict = {}
  t0 = time.perf_counter()
  for i, (label, (hidden, ffn_dim)) in enumerate(shapes.items()):
    if args.budget is not None and time.perf_counter() - t0 > args.budget:
      log(f"[gemm_sweep] budget of {args.budget:.0f}s spent: {label} and later shapes not run")
      break
    log(f"[gemm_sweep] {label} (H={hidden}, D={ffn_dim}), T={args.tokens}")
    rows += sweep_shape(label, hidden, ffn_dim, args, opts, make, timed)
    paths = run_.write(rows, markdown(rows, kind, timed), complete=i == len(shapes) - 1)
  log(f"[gemm_sweep] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": rows, "paths": paths}


def markdown(rows: list[dict], kind: str, timed: bool) -> str:
  head = ["shape", "gemm", "dtype", "m x n x k", "backend", "tile", "kernels"]
  head += ["ms", "IQR ms", "T(FL)OP/s"] if timed else []
  out = []
  for r in rows:
    cells = [r["shape"], r["gemm"], r["dtype"], f"{r['m']} x {r['n']} x {r['k']}"]
    if "error" in r:
      out.append([*cells, "error: " + r["error"][:80], "", "", *([""] * 3 if timed else [])])
      continue
    cells += [f"{r['backend']} {r['lhs']} x {r['rhs']} -> {r['out']}", r["tile"], r["kernels"]]
    if timed:
      cells += (
        [f"{r['seconds'] * 1e3:.3f}", f"{r['iqr_s'] * 1e3:.3f}", f"{r['tops']:.3g}"] if "seconds" in r else [""] * 3
      )
    out.append(cells)
  what = "timed on the device" if timed else "compiled deviceless (no timing; XLA's default GEMM configurations)"
  align = ["l"] * 7 + ["r"] * (3 if timed else 0)
  return f"Device: {kind}, {what}. kernels: fusions and custom calls of the one-GEMM program.\n\n" + markdown_table(
    head, out, align=align
  )
