"""Bit-exact check of the Pallas grouped GEMMs against `jax.lax.ragged_dot` at an MoE shape.

`python -m benchmarks.pallas_check [--shape qwen3-30b-a3b] [--tokens 512] [--out-dir DIR]`

On a GPU, impl="pallas" runs the compiled (Triton) kernels: the check first asserts that the
lowered program holds a Triton kernel call, then compares in five families, bit for bit but "bf16":
1. "pallas": the int32 forward, dX and dW GEMMs (grouped_gemm.gmm / gmm_nt / tgmm) with the
   ragged and the tiled paths;
2. "bf16": the bf16 x bf16 -> f32 forward, dX and dW kernels (the bf16 recipe's) with the ragged
   path on the same bf16 operands, within the bound of f32 sums taken in another order:
   |got - want| ≤ 2·n·2⁻²⁴·Σ|p| (n the contracted length, Σ|p| the sum of the products'
   magnitudes; a product of two bf16 values is exact in f32);
3. "tiled dW": the ragged dW against numpy, and the tiled dW against the ragged one at the
   shape's own tile and at tiles 32 and 128 (forced through `grouped_gemm.layout`), each in
   int32 and in f32 (integer-valued operands at HIGHEST precision, so exact: the float GEMMs'
   path);
4. "xla dot": one XLA int8 x int8 -> int32 dot [K, L] x [L, N] with L = 8, 32, 128 (the tiled
   dW's window product, its lhs a transposed slice) against numpy;
5. "grouped_qmatmul": grouped_qmatmul's output and both gradients per recipe (s3r_ec_dx, s3r,
   int8_rtne) with the ragged path,
on R = tokens · top_k rows with an uneven routing: skewed expert sizes, some empty experts and
padding rows past the sum. Elsewhere the kernels run in interpret mode (use a tiny custom shape,
e.g. --shape 64x8x2x48). Results go to <out-dir>/pallas_check.json after every part, each
check with its family. Exit status: 0 when everything is bit-exact ("bf16": within its bound); 1
(with a line starting "PALLAS CHECK FAILED" that names the failing families and checks) when a check of the paths the
default takes ("pallas", "bf16", "grouped_qmatmul") differs, fails to compile or is not a Triton kernel
on a GPU; 3 (a line starting "PALLAS CHECK PASSED, DIAGNOSTICS FAILED") when only the diagnostic
families ("tiled dW", "xla dot": they locate a fault of the tiled dW, which the GPU default does
not run) differ, so a device script keeps the Pallas path.

Dimension letters: R rows, E experts, K = hidden, N = expert width.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback
from typing import Any

import numpy as np

from benchmarks.moe import parse_shapes
from labtools.results import log

RECIPES = ("s3r_ec_dx", "s3r", "int8_rtne")
DIAGNOSTIC_FAMILIES = ("tiled dW", "xla dot")  # their failure alone is exit status 3, not 1
DIAGNOSTIC_EXIT = 3
_TRITON_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call")  # the custom-call targets of Pallas Triton kernels


def routing(rows: int, experts: int, seed: int) -> np.ndarray:
  """Uneven int32 group sizes [E]: Dirichlet(0.3) shares, every 5th expert empty, ~3% padding rows."""
  rng = np.random.default_rng(seed)
  shares = rng.dirichlet(np.full(experts, 0.3))
  shares[::5] = 0.0
  shares /= shares.sum()
  routed = rows - max(1, rows // 32)
  return rng.multinomial(routed, shares).astype(np.int32)


FAMILIES = ("pallas", "bf16", "tiled dW", "xla dot", "grouped_qmatmul")
WINDOWS = (8, 32, 128)  # the contraction lengths of the "xla dot" checks and the forced tiles of "tiled dW"


def _compare(family: str, name: str, got, want) -> dict:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  same = got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
  diff = np.abs(got - want) if got.shape == want.shape else np.full(1, np.inf)
  row = {
    "family": family,
    "name": name,
    "bit_exact": bool(same),
    "mismatches": int((diff != 0).sum()),
    "max_abs_diff": float(diff.max(initial=0.0)),
  }
  log(f"  {'ok  ' if same else 'DIFF'} {name}: {row['mismatches']} mismatches, max |diff| {row['max_abs_diff']:.3g}")
  return row


def check_gemms(shape: dict, rows: int, seed: int, report: dict) -> None:
  import jax
  import jax.numpy as jnp

  from s3r.quant.grouped import gemm as grouped_gemm

  e, k, n = shape["experts"], shape["hidden"], shape["expert_width"]
  rng = np.random.default_rng(seed)
  a = jnp.asarray(rng.integers(-127, 128, (rows, k)), jnp.int8)
  q = jnp.asarray(rng.integers(-127, 128, (rows, n)), jnp.int8)
  w = jnp.asarray(rng.integers(-127, 128, (e, k, n)), jnp.int8)
  sizes = jnp.asarray(routing(rows, e, seed), jnp.int32)

  def gemms(impl):
    def f(a, q, w, sizes):
      lay = grouped_gemm.layout(sizes, rows)
      return grouped_gemm.gmm(a, w, lay, impl), grouped_gemm.gmm_nt(q, w, lay, impl), grouped_gemm.tgmm(a, q, lay, impl)

    return jax.jit(f)

  lowered = gemms("pallas").lower(a, q, w, sizes)
  text = lowered.as_text()
  report["triton_kernel_calls"] = sum(text.count(t) for t in _TRITON_TARGETS)
  if jax.default_backend() == "gpu" and report["triton_kernel_calls"] < 3:
    raise RuntimeError(f"impl='pallas' did not lower to Triton kernels on GPU ({report['triton_kernel_calls']} calls)")
  t0 = time.perf_counter()
  got = jax.block_until_ready(lowered.compile()(a, q, w, sizes))
  report["pallas_compile_and_first_call_s"] = round(time.perf_counter() - t0, 2)
  for ref in ("ragged", "tiled"):
    want = gemms(ref)(a, q, w, sizes)
    for what, g, r in zip(("forward", "dX", "dW"), got, want):
      report["checks"].append(_compare("pallas", f"int32 {what} pallas vs {ref}", g, r))


def _compare_within(family: str, name: str, got, want, bound) -> dict:
  """`_compare`, and whether every |got - want| is within `bound` (elementwise): the pass of a float check."""
  row = _compare(family, name, got, want)
  diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
  row["within_bound"] = bool(diff.shape == np.shape(bound) and (diff <= bound).all())
  log(f"  {'ok  ' if row['within_bound'] else 'OVER'} {name}: within the f32 bound")
  return row


def passes(check: dict) -> bool:
  """A check's pass: bit-exact, or within its bound for a float check."""
  return check.get("within_bound", check["bit_exact"])


def check_bf16_gemms(shape: dict, rows: int, seed: int, report: dict) -> None:
  """The bf16 kernels' forward, dX and dW against ragged_dot on the same bf16 operands, within the f32 bound
  (Σ|p| from the ragged products of |a| and |b| at full f32 precision, 1% added for their own rounding)."""
  import jax
  import jax.numpy as jnp

  from s3r.quant.grouped import gemm as grouped_gemm

  e, k, n = shape["experts"], shape["hidden"], shape["expert_width"]
  rng = np.random.default_rng(seed + 2)
  a = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
  q = jnp.asarray(rng.standard_normal((rows, n)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((e, k, n)), jnp.bfloat16)
  sizes = jnp.asarray(routing(rows, e, seed), jnp.int32)

  def gemms(impl, precision=None):
    def f(a, q, w, sizes):
      lay = grouped_gemm.layout(sizes, rows)
      kw = dict(out=jnp.float32, precision=precision)
      return (
        grouped_gemm.gmm(a, w, lay, impl, **kw),
        grouped_gemm.gmm_nt(q, w, lay, impl, **kw),
        grouped_gemm.tgmm(a, q, lay, impl, **kw),
      )

    return jax.jit(f)

  got = gemms("pallas")(a, q, w, sizes)
  want = gemms("ragged")(a, q, w, sizes)
  f32 = [jnp.abs(x).astype(jnp.float32) for x in (a, q, w)]
  abs_sums = gemms("ragged", jax.lax.Precision.HIGHEST)(*f32, sizes)
  for what, g, r, s, c in zip(("forward", "dX", "dW"), got, want, abs_sums, (k, n, rows)):
    bound = 2 * c * 2.0**-24 * 1.01 * np.asarray(s, np.float64)
    report["checks"].append(_compare_within("bf16", f"bf16 {what} pallas vs ragged", g, r, bound))


def check_tiled_dw(shape: dict, rows: int, seed: int, report: dict) -> None:
  """The tiled dW against the ragged one (and that against numpy) at several tiles, int32 and f32."""
  import functools

  import jax
  import jax.numpy as jnp

  from s3r.quant.grouped import gemm as grouped_gemm

  e, k, n = shape["experts"], shape["hidden"], shape["expert_width"]
  rng = np.random.default_rng(seed)  # the operands of check_gemms
  a_np, q_np = rng.integers(-127, 128, (rows, k)), rng.integers(-127, 128, (rows, n))
  sizes_np = routing(rows, e, seed)
  ends = np.cumsum(sizes_np)
  want = np.stack([a_np[s:t].T @ q_np[s:t] for s, t in zip(ends - sizes_np, ends)])  # int64, exact
  sizes = jnp.asarray(sizes_np, jnp.int32)
  own = grouped_gemm.tile_rows(rows, e)
  report["tiled_dw_tiles"] = tiles = sorted({own, *WINDOWS[1:]})

  @functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
  def dw(a, q, sizes, impl, tile, out, precision):
    return grouped_gemm.tgmm(a, q, grouped_gemm.layout(sizes, rows, tile=tile), impl, out=out, precision=precision)

  for label, dtype, out, precision in (
    ("int32", jnp.int8, jnp.int32, None),
    ("f32", jnp.float32, jnp.float32, jax.lax.Precision.HIGHEST),
  ):
    a, q = jnp.asarray(a_np, dtype), jnp.asarray(q_np, dtype)
    ragged = dw(a, q, sizes, "ragged", None, out, precision)
    report["checks"].append(_compare("tiled dW", f"{label} dW ragged vs numpy", ragged, want))
    for tile in tiles:
      tiled = dw(a, q, sizes, "tiled", tile, out, precision)
      report["checks"].append(_compare("tiled dW", f"{label} dW tiled vs ragged, tile {tile}", tiled, ragged))


def check_xla_dot(shape: dict, seed: int, report: dict) -> None:
  """One XLA int8 dot [K, L] x [L, N] -> int32 per window length L, its lhs a transposed slice."""
  import jax
  import jax.numpy as jnp

  k, n = shape["hidden"], shape["expert_width"]
  rng = np.random.default_rng(seed + 2)
  dot = jax.jit(lambda a_LxK, q_LxN: jnp.dot(a_LxK.T, q_LxN, preferred_element_type=jnp.int32))
  for length in WINDOWS:
    a, q = rng.integers(-127, 128, (length + 8, k)), rng.integers(-127, 128, (length + 8, n))
    got = dot(jnp.asarray(a[3 : 3 + length], jnp.int8), jnp.asarray(q[3 : 3 + length], jnp.int8))
    want = a[3 : 3 + length].T @ q[3 : 3 + length]
    report["checks"].append(_compare("xla dot", f"int8 dot [K, {length}] x [{length}, N] vs numpy", got, want))


def check_qmatmul(shape: dict, rows: int, seed: int, recipe: str, report: dict) -> None:
  import jax
  import jax.numpy as jnp

  import s3r

  e, k, n = shape["experts"], shape["hidden"], shape["expert_width"]
  rng = np.random.default_rng(seed + 1)
  x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((e, k, n)) * 0.02, jnp.float32)
  g = jnp.asarray(rng.standard_normal((rows, n)), jnp.bfloat16)
  sizes = jnp.asarray(routing(rows, e, seed), jnp.int32)
  key = jax.random.key(seed)

  @jax.jit
  def fwd_bwd_pallas(x, w, sizes, g, key):
    return _fwd_bwd(s3r, recipe, "pallas", x, w, sizes, g, key)

  @jax.jit
  def fwd_bwd_ragged(x, w, sizes, g, key):
    return _fwd_bwd(s3r, recipe, "ragged", x, w, sizes, g, key)

  got = fwd_bwd_pallas(x, w, sizes, g, key)
  want = fwd_bwd_ragged(x, w, sizes, g, key)
  for what, a, b in zip(("y", "dx", "dw"), got, want):
    report["checks"].append(_compare("grouped_qmatmul", f"grouped_qmatmul {recipe} {what} pallas vs ragged", a, b))


def _fwd_bwd(s3r, recipe, impl, x, w, sizes, g, key):
  import jax

  y, vjp = jax.vjp(lambda a, b: s3r.grouped_qmatmul(a, b, sizes, key=key, recipe=recipe, impl=impl), x, w)
  return (y, *vjp(g))


def _failed_families(report: dict) -> dict[str, list[str]]:
  """{family: [names of its differing checks]} for each family with a difference, then
  {"errors": [parts]} if a part raised."""
  failed: dict[str, list[str]] = {}
  for c in report["checks"]:
    if not passes(c):
      failed.setdefault(c["family"], []).append(c["name"])
  if report["errors"]:
    failed["errors"] = [e["part"] for e in report["errors"]]
  return failed


def diagnostic_only(failed: dict[str, list[str]]) -> bool:
  """True when every failure (differing checks, and parts that raised) is of a diagnostic family."""
  families = [f for f in failed if f != "errors"] + failed.get("errors", [])
  return bool(families) and all(f in DIAGNOSTIC_FAMILIES for f in families)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", default="qwen3-30b-a3b", help="a paper MoE shape or HxExkxF (default %(default)s)")
  p.add_argument("--tokens", type=int, default=512, help="tokens; R = tokens · top_k rows (default %(default)s)")
  p.add_argument("--recipes", default=",".join(RECIPES), help="grouped_qmatmul recipes (default %(default)s)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out-dir", default=".", help="where pallas_check.json goes (default %(default)s)")
  args = p.parse_args(argv)
  import jax

  ((name, shape),) = parse_shapes(args.shape).items()
  rows = args.tokens * shape["top_k"]
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  report: dict[str, Any] = {
    "shape": name,
    **shape,
    "rows": rows,
    "backend": jax.default_backend(),
    "checks": [],
    "errors": [],
  }
  report["devices"] = [str(d) for d in jax.devices()]
  log(f"[pallas_check] {name} {shape}, R={rows}, backend {report['backend']}")
  parts = [("int32 GEMMs", lambda: check_gemms(shape, rows, args.seed, report))]
  parts += [("bf16 GEMMs", lambda: check_bf16_gemms(shape, rows, args.seed, report))]
  parts += [("tiled dW", lambda: check_tiled_dw(shape, rows, args.seed, report))]
  parts += [("xla dot", lambda: check_xla_dot(shape, args.seed, report))]
  parts += [(r, lambda r=r: check_qmatmul(shape, rows, args.seed, r, report)) for r in args.recipes.split(",") if r]
  for part, fn in parts:
    try:
      fn()
    except Exception as exc:  # a kernel that does not compile is a result to report, then the other parts run
      report["errors"].append({"part": part, "error": f"{type(exc).__name__}: {exc}"[:4000]})
      log(f"PALLAS CHECK ERROR in {part}:\n{traceback.format_exc()}")
    report["passed"] = not report["errors"] and all(passes(c) for c in report["checks"])
    report["failed_families"] = _failed_families(report)
    (out / "pallas_check.json").write_text(json.dumps(report, indent=1))
  if not report["passed"]:
    failed = report["failed_families"]
    summary = "; ".join(f"{family}: {', '.join(names)}" for family, names in failed.items())
    if diagnostic_only(failed):
      print(f"PALLAS CHECK PASSED, DIAGNOSTICS FAILED ({', '.join(failed)}): {summary}", flush=True)
      return DIAGNOSTIC_EXIT
    print(f"PALLAS CHECK FAILED ({', '.join(failed)}): {summary}", flush=True)
    return 1
  summary = f"{len(report['checks'])} comparisons bit-exact (bf16: within the f32 bound)"
  print(f"PALLAS CHECK PASSED: {summary} on {report['backend']}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
