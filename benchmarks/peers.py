"""`python -m benchmarks peers`: our recipes next to AQT and Qwix on the same SwiGLU FFN block.

Needs the optional extra `pip install -e .[peers]` (aqtp, qwix); without it the peer rows
are skipped with a note and our own rows are still measured. Peer code is only called
through its public API, never copied.

Peers (each projection of the block y = down(silu(gate(x)) * up(x)) through the peer):
  aqt_fully_quantized  AQT `config.fully_quantized(fwd_bits=8, bwd_bits=8)`: its default
                       INT8 training config, stochastic rounding (full-size `jax.random.uniform`
                       noise) on both backward operands, the gradient quantized per product.
  aqt_v3_grad_sr       AQT `config.config_v3(fwd_bits=8, dlhs_bits=8, drhs_bits=8,
                       rng_type='jax.uniform')` (MaxText's `int8`): SR on the gradient only.
  qwix_sr              Qwix `QtRule(weight/act/bwd int8, bwd_stochastic_rounding='uniform')`,
                       its default noise sharing `channelwise_noise_axes=(0,)`: with x [T, H],
                       one random value per token (uncorrected per-token sharing).
  qwix_sr_elementwise  the same with `channelwise_noise_axes=(0, 1)`: one value per element.
AQT needs equal operand dtypes, so its weights enter as bf16 casts of the f32 masters; Qwix
runs flax.linen Dense layers with dtype bf16 on the same f32 weights.

Reported, all in one run: time per fwd+bwd (interleaved medians) and its ratio to
`s3r_ec_dx` (> 1: s3r_ec_dx is faster); the relative gradient error ||ĝ - g|| / ||g|| of dX
and of the three weight gradients (concatenated) against the exact f32 gradient of the
unquantized block, averaged over --keys keys, and the error of the key-averaged gradient
(a bias indicator: it shrinks like 1/sqrt(keys) for unbiased estimators).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import numpy as np

from benchmarks import options, timing
from labtools.results import RESULTS_DIR, Run, bar_chart, fmt_ms, fmt_ratio, loadavg, log, markdown_table, parse_list

DEFAULT_SHAPES = "W1,W2"
DEFAULT_OURS = "bf16,int8_rtne,int8_sr,s3r,s3r_ec,s3r_ec_dx"
DEFAULT_TIMED_OURS = "bf16,int8_sr,s3r_ec_dx"
PEERS = ("aqt_fully_quantized", "aqt_v3_grad_sr", "qwix_sr", "qwix_sr_elementwise")
REFERENCE = "s3r_ec_dx"
INSTALL_HINT = "pip install -e '.[peers]'"


def _import_aqt():
  from aqt.jax.v2 import config as aqt_config  # noqa: PLC0415

  return aqt_config


def _import_qwix():
  import flax.linen as nn  # noqa: PLC0415
  import qwix  # noqa: PLC0415

  return qwix, nn


def available() -> dict[str, str | None]:
  """Peer name -> None if usable, else why not (e.g. the package is not installed)."""
  status = {}
  for libname, importer, names in (("aqtp", _import_aqt, PEERS[:2]), ("qwix", _import_qwix, PEERS[2:])):
    try:
      importer()
      why = None
    except ImportError as e:  # includes ModuleNotFoundError and modules set to None in sys.modules
      why = f"{libname} not installed ({e}); install with {INSTALL_HINT}"
    for n in names:
      status[n] = why
  return status


# --- the block, per peer ---------------------------------------------------------------------

_DN = (((1,), (0,)), ((), ()))


def _aqt_block(cfg):
  import jax

  aqt_config = _import_aqt()

  def ffn(x, wg, wu, wd, key):
    kg, ku, kd = jax.random.split(key, 3)
    mm = lambda a, w, k: aqt_config.set_context(cfg, k, None)(a, w.astype(a.dtype), _DN)  # noqa: E731
    h = jax.nn.silu(mm(x, wg, kg)) * mm(x, wu, ku)
    return mm(h, wd, kd)

  return ffn


def _qwix_block(noise_axes):
  import jax
  import jax.numpy as jnp

  qwix, nn = _import_qwix()

  class FFN(nn.Module):
    hidden: int
    ffn_dim: int

    @nn.compact
    def __call__(self, x):
      dense = functools.partial(nn.Dense, use_bias=False, dtype=jnp.bfloat16)
      h = jax.nn.silu(dense(self.ffn_dim, name="gate")(x)) * dense(self.ffn_dim, name="up")(x)
      return dense(self.hidden, name="down")(h)

  rule = qwix.QtRule(
    module_path=".*",
    weight_qtype=jnp.int8,
    act_qtype=jnp.int8,
    bwd_qtype=jnp.int8,
    bwd_stochastic_rounding="uniform",
    channelwise_noise_axes=tuple(noise_axes),
  )

  def ffn(x, wg, wu, wd, key):
    model = qwix.quantize_model(FFN(wg.shape[0], wg.shape[1]), qwix.QtProvider([rule]))
    params = {"params": {"gate": {"kernel": wg}, "up": {"kernel": wu}, "down": {"kernel": wd}}}
    return model.apply(params, x, rngs={"stochastic_rounding": key})

  return ffn


def make_block(name: str):
  """f(x, wg, wu, wd, key) -> y for one of our recipes or a peer."""
  if name == "aqt_fully_quantized":
    return _aqt_block(_import_aqt().fully_quantized(fwd_bits=8, bwd_bits=8))
  if name == "aqt_v3_grad_sr":
    import jax.numpy as jnp

    return _aqt_block(
      _import_aqt().config_v3(
        fwd_bits=8, dlhs_bits=8, drhs_bits=8, rng_type="jax.uniform", drhs_accumulator_dtype=jnp.int32
      )
    )
  if name == "qwix_sr":
    return _qwix_block((0,))
  if name == "qwix_sr_elementwise":
    return _qwix_block((0, 1))
  from benchmarks import ffn

  return ffn.make_ffn(name)


def make_fwd_bwd(name: str):
  from benchmarks import ffn

  return ffn.fwd_bwd_of(make_block(name))


def exact_grads(x, wg, wu, wd, dy):
  """f32 gradient of the unquantized block (HIGHEST precision) for the same inputs."""
  import jax
  import jax.numpy as jnp

  hi = jax.lax.Precision.HIGHEST

  def block(x, wg, wu, wd):
    h = jax.nn.silu(jnp.dot(x, wg, precision=hi)) * jnp.dot(x, wu, precision=hi)
    return jnp.dot(h, wd, precision=hi)

  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  _, vjp = jax.vjp(block, f32(x), wg, wu, wd)
  return jax.jit(lambda d: vjp(d))(f32(dy))


def gradient_errors(fn, inputs, exact, keys: int, seed: int = 1) -> dict:
  """Mean over keys of the relative error of dX and of [dWg, dWu, dWd], and of the key-mean."""
  import jax

  x, wg, wu, wd, dy, _ = inputs
  gx = np.asarray(exact[0], np.float64)
  gw = np.concatenate([np.asarray(g, np.float64).ravel() for g in exact[1:]])
  nx, nw = np.linalg.norm(gx), np.linalg.norm(gw)
  ex, ew, sx, sw = [], [], np.zeros_like(gx), np.zeros_like(gw)
  for k in jax.random.split(jax.random.key(seed), keys):
    out = jax.block_until_ready(fn(x, wg, wu, wd, dy, k))
    hx = np.asarray(out[0], np.float64)
    hw = np.concatenate([np.asarray(g, np.float64).ravel() for g in out[1:]])
    ex.append(np.linalg.norm(hx - gx) / nx)
    ew.append(np.linalg.norm(hw - gw) / nw)
    sx += hx
    sw += hw
  return {
    "dx_rel_err": float(np.mean(ex)),
    "dw_rel_err": float(np.mean(ew)),
    "dx_rel_err_std": float(np.std(ex)),
    "dw_rel_err_std": float(np.std(ew)),
    "dx_rel_err_of_mean": float(np.linalg.norm(sx / keys - gx) / nx),
    "dw_rel_err_of_mean": float(np.linalg.norm(sw / keys - gw) / nw),
    "keys": keys,
  }


# --- command ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--shapes",
    default=DEFAULT_SHAPES,
    help="paper shapes W1..W9, 'all' or custom HxD (e.g. 256x1024) (default %(default)s)",
  )
  p.add_argument(
    "--tokens", type=int, default=None, help="tokens T per call (default: the ffn bench's per-shape default)"
  )
  p.add_argument(
    "--ours", default=DEFAULT_OURS, help="our recipes whose gradient error is measured (default %(default)s)"
  )
  p.add_argument(
    "--timed-ours",
    default=DEFAULT_TIMED_OURS,
    help=f"our recipes timed next to the peers (default %(default)s; {REFERENCE} is always timed)",
  )
  p.add_argument("--peers", default=",".join(PEERS), help="peers to run (default %(default)s)")
  p.add_argument(
    "--repeats", type=int, default=5, help="timed calls per configuration, interleaved (default %(default)s)"
  )
  p.add_argument("--warmup", type=int, default=1, help="untimed calls after the compiling call (default %(default)s)")
  p.add_argument("--keys", type=int, default=4, help="keys averaged in the gradient error (default %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default %(default)s)")
  p.add_argument("--no-timing", action="store_true", help="only measure gradient errors")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_peers_<platform>.{json,md,png} go (default %(default)s)"
  )
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def run(args: argparse.Namespace) -> dict:
  from benchmarks import ffn
  from s3r import RECIPES

  shapes = options.parse_shapes(args.shapes)
  ours = parse_list(args.ours, list(RECIPES), "recipes")
  timed_ours = parse_list(args.timed_ours, list(RECIPES), "recipes")
  if REFERENCE not in timed_ours:
    timed_ours.append(REFERENCE)
  peers = parse_list(args.peers, list(PEERS), "peers")
  status = available()
  skipped = {p: status[p] for p in peers if status[p]}
  usable = [p for p in peers if not status[p]]
  for p, why in skipped.items():
    log(f"[peers] skipping {p}: {why}")
  run_ = Run(
    "peers",
    args.out_dir,
    shapes=",".join(shapes),
    tokens=args.tokens,
    ours=",".join(ours),
    timed_ours=",".join(timed_ours),
    peers=",".join(peers),
    repeats=args.repeats,
    warmup=args.warmup,
    keys=args.keys,
    seed=args.seed,
    timing=not args.no_timing,
  )
  results = []
  for shape in shapes:
    hidden, ffn_dim = shapes[shape]
    tokens = options.tokens_for(shape, args.tokens)
    log(f"[peers] {shape} (H={hidden}, D_ffn={ffn_dim}), T={tokens}, load {loadavg()}")
    inputs = ffn.make_inputs(tokens, hidden, ffn_dim, args.seed)
    fns = {n: make_fwd_bwd(n) for n in dict.fromkeys([*ours, *timed_ours, *usable])}
    timings = {}
    if not args.no_timing:
      configs = {n: (fns[n], inputs) for n in dict.fromkeys([*timed_ours, *usable])}
      timings = timing.time_interleaved(configs, repeats=args.repeats, warmup=args.warmup, log=log)
      log("  " + ", ".join(f"{n} {t.median * 1e3:.1f} ms" for n, t in timings.items()))
    exact = exact_grads(*inputs[:5])
    errors = {}
    for n in dict.fromkeys([*ours, *usable]):
      errors[n] = gradient_errors(fns[n], inputs, exact, args.keys)
      log(f"  {n}: dX err {errors[n]['dx_rel_err']:.4f}, dW err {errors[n]['dw_rel_err']:.4f}")
    rows = {}
    for n in dict.fromkeys([*ours, *timed_ours, *usable]):
      row: dict[str, Any] = {"kind": "peer" if n in PEERS else "s3r", "errors": errors.get(n)}
      if n in timings:
        row["timing"] = timings[n].as_dict()
        row["time_vs_" + REFERENCE] = timings[n].median / timings[REFERENCE].median
        row["time_vs_" + REFERENCE + "_paired"] = timing.paired_ratio(timings[n], timings[REFERENCE])
      rows[n] = row
    results.append({"shape": shape, "hidden": hidden, "ffn_dim": ffn_dim, "tokens": tokens, "configs": rows})
    del fns, inputs, exact
  out = {"skipped": skipped, "shapes": results}
  paths = run_.write(
    out, markdown(out), chart=None if (args.no_chart or args.no_timing) else functools.partial(chart, out)
  )
  log(f"[peers] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": out, "paths": paths}


def markdown(out: dict) -> str:
  lines = ["## Peers on one SwiGLU FFN block, forward + backward (same run, same inputs)", ""]
  if out["skipped"]:
    lines += ["Skipped (not installed): " + "; ".join(f"`{p}`: {why}" for p, why in out["skipped"].items()), ""]
  head = [
    "shape",
    "T",
    "config",
    "median ms",
    "IQR ms",
    f"time / {REFERENCE}",
    "dX rel err",
    "dW rel err",
    "dX err of key-mean",
    "dW err of key-mean",
  ]
  rows = []
  for res in out["shapes"]:
    for n, row in res["configs"].items():
      t = row.get("timing")
      e = row.get("errors") or {}
      f4 = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
      rows.append(
        [
          res["shape"],
          res["tokens"],
          n,
          fmt_ms(t["median_s"]) if t else "",
          fmt_ms(t["iqr_s"]) if t else "",
          fmt_ratio(row.get("time_vs_" + REFERENCE)),
          f4(e.get("dx_rel_err")),
          f4(e.get("dw_rel_err")),
          f4(e.get("dx_rel_err_of_mean")),
          f4(e.get("dw_rel_err_of_mean")),
        ]
      )
  lines.append(markdown_table(head, rows, align=["l", "r", "l"] + ["r"] * 7))
  keys = next((r["errors"]["keys"] for s in out["shapes"] for r in s["configs"].values() if r.get("errors")), None)
  lines += [
    "",
    f"Errors: ||ĝ - g|| / ||g|| against the exact f32 gradient of the unquantized block, mean over "
    f"{keys} keys; 'err of key-mean' uses the mean gradient over the keys (bias indicator). "
    f"time / {REFERENCE} > 1 means {REFERENCE} is faster.",
    "",
  ]
  return "\n".join(lines)


def chart(out: dict, path) -> None:
  shapes = out["shapes"]
  names = [n for n in shapes[0]["configs"] if shapes[0]["configs"][n].get("timing")]
  series = {n: [s["configs"][n].get("time_vs_" + REFERENCE) for s in shapes] for n in names}
  bar_chart(
    path,
    [f"{s['shape']}\nT={s['tokens']}" for s in shapes],
    series,
    hline=1.0,
    ylabel=f"time / time({REFERENCE})",
    title="SwiGLU FFN fwd+bwd vs s3r_ec_dx (same run)",
  )
