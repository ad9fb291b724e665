"""`python -m research.compile_probe --out DIR ...`: the XLA flags under which the lockstep run's
train step compiles fastest without slowing the step, measured before the run.

On the H200 the INT8 recipes compile far slower than bf16 (the first `device_quality.sh` call spent
423.5 s compiling `paper-12l` x 3 recipes, research/results/device_quality/). XLA_FLAGS must be set
before JAX starts, so each candidate flag set is measured in its own subprocess: one train step of
the run's preset sliced to `--layers` layers (1 by default) for one recipe (`s3r_ec_dx`), at the
run's batch and sequence, is traced, compiled and run (one untimed call, then `--timed-steps` timed
ones): the run's own program at fewer layers. Each subprocess has its own timeout (`--timeout`,
and never past what is left of `--budget`); a timeout or an error makes the candidate a failure.

The rule: among the candidates that compiled and ran, the one with the smallest compile time whose
step time is at most `--slack` (1.5) times the default's; when the default itself failed, the
fastest step among the others is the reference; when every candidate failed, the default. On a GPU
the candidates run cheapest first, so a default that does not compile in time cannot starve them:
`no_triton_gemm_autotune0`, `no_triton_gemm`, `default`. Elsewhere only the default runs (the other
flags mean nothing there), and after a candidate reports a backend other than the GPU, the
GPU-only candidates are skipped.

An XLA_FLAGS already set is the base of every candidate: the default is the base alone, the others
add their flags after it (scripts/device_quality.sh skips the probe when the caller set XLA_FLAGS,
unless PROBE=always).

Output folder: probe.json (settings, every candidate's timings or error, the rule, the choice;
rewritten after every candidate) and xla_flags.txt (the chosen XLA_FLAGS, one line, empty for the
default without a base), which scripts/device_quality.sh exports for the lockstep run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

DEFAULT = "default"
# name -> (XLA_FLAGS, only meaningful on a GPU), in the order they run on a GPU (cheapest first)
CANDIDATES = {
  "no_triton_gemm_autotune0": ("--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0", True),
  "no_triton_gemm": ("--xla_gpu_enable_triton_gemm=false", True),
  DEFAULT: ("", False),
}
RESULT_PREFIX = "PROBE_RESULT "
RULE = (
  "smallest compile_s among the candidates that compiled and ran whose step_s is at most slack x the "
  "default's (the fastest step_s among them when the default failed); the default when all failed"
)
MIN_CANDIDATE_S = 5.0  # a candidate with less time than this left in the budget is skipped


# --- one candidate, in its own process ---------------------------------------------------------


def measure(args: argparse.Namespace) -> dict:
  """Traces, compiles and runs one train step of the sliced preset; the seconds of each phase."""
  t0 = time.monotonic()
  import dataclasses

  import jax
  import numpy as np

  from research import lockstep
  from s3r.train import attention
  from s3r.train.step.optimizer import OptimizerConfig, make_optimizer

  backend = jax.default_backend()
  out = {"backend": backend, "startup_s": time.monotonic() - t0}
  mcfg = lockstep.model_config(
    args.preset, args.recipe, args.vocab, args.seq, "xla", args.tp_partial_sums, layers=args.layers
  )
  impl, note = attention.resolve(args.attention, mcfg, batch=args.batch, seq=args.seq)
  mcfg = dataclasses.replace(mcfg, attention_impl=impl)
  out |= {"attention": impl, "attention_note": note}
  # the run's optimizer (its schedule length is a constant of the program), at the unit rate
  tx = make_optimizer(lockstep.unit_rate(OptimizerConfig(total_steps=args.schedule_steps, warmup_steps=0)))
  init_key, train_key = jax.random.split(jax.random.key(0))
  t = time.monotonic()
  state, lowered = lockstep.lower_train_step(mcfg, tx, init_key, args.batch, args.seq)
  out["lower_s"] = time.monotonic() - t
  step, out["compile_s"] = lockstep.timed_compile(lowered)
  tokens = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq + 1)).astype(np.int32)
  lr = np.float32(1e-4)
  t = time.monotonic()
  state, _ = jax.block_until_ready(step(state, tokens, train_key, lr))
  out["first_call_s"] = time.monotonic() - t
  times = []
  for _ in range(args.timed_steps):
    t = time.monotonic()
    state, _ = jax.block_until_ready(step(state, tokens, train_key, lr))
    times.append(time.monotonic() - t)
  out["step_s"] = float(np.median(times))
  return out


# --- the candidates, one subprocess each --------------------------------------------------------


def expects_gpu(env: dict) -> bool:
  """Whether JAX in a child would see a GPU (no JAX start here: the parent must not hold the device)."""
  platforms = env.get("JAX_PLATFORMS", "")
  if platforms and not any(p in platforms for p in ("cuda", "gpu")):
    return False
  return pathlib.Path("/dev/nvidiactl").exists()


def candidate_names(requested: str, gpu: bool) -> list[str]:
  """The candidates to run: those asked for (comma-separated), else by backend."""
  if requested:
    names = [n for n in requested.split(",") if n]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
      raise ValueError(f"unknown candidates {unknown}; valid: {', '.join(CANDIDATES)}")
    return names
  return [n for n, (_, gpu_only) in CANDIDATES.items() if gpu or not gpu_only]


def child_argv(args: argparse.Namespace, attention: str) -> list[str]:
  argv = [sys.executable, "-m", "research.compile_probe", "--child", "--preset", args.preset]
  argv += ["--layers", str(args.layers), "--recipe", args.recipe, "--vocab", str(args.vocab)]
  argv += ["--batch", str(args.batch), "--seq", str(args.seq), "--attention", attention]
  argv += ["--tp-partial-sums", args.tp_partial_sums, "--schedule-steps", str(args.schedule_steps)]
  return argv + ["--timed-steps", str(args.timed_steps)]


def with_base(name: str, base: str) -> str:
  """XLA_FLAGS of a candidate: the caller's flags (`base`) followed by the candidate's own."""
  return " ".join(f for f in (base, CANDIDATES[name][0]) if f)


def run_candidate(name: str, argv: list[str], env: dict, timeout: float) -> dict:
  """The candidate's result: status ok (with the child's timings), failed or timeout; wall_s."""
  flags = with_base(name, env.get("XLA_FLAGS", ""))
  rec = {"name": name, "xla_flags": flags, "timeout_s": round(timeout, 1)}
  t0 = time.monotonic()
  try:
    proc = subprocess.run(argv, env={**env, "XLA_FLAGS": flags}, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return rec | {"status": "timeout", "wall_s": round(time.monotonic() - t0, 2)}
  rec["wall_s"] = round(time.monotonic() - t0, 2)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return rec | {"status": "failed", "returncode": proc.returncode, "error": "\n".join(tail)[-2000:]}
  return rec | {"status": "ok", **json.loads(lines[-1].removeprefix(RESULT_PREFIX))}


def choose(results: list[dict], slack: float) -> str:
  """The chosen candidate's name (see RULE)."""
  ok = [r for r in results if r["status"] == "ok"]
  if not ok:
    return DEFAULT
  default = next((r for r in ok if r["name"] == DEFAULT), None)
  reference = default["step_s"] if default else min(r["step_s"] for r in ok)
  eligible = [r for r in ok if r["step_s"] <= slack * reference]
  return min(eligible, key=lambda r: r["compile_s"])["name"]


def describe(rec: dict) -> str:
  if rec["status"] == "ok":
    return (
      f"compile {rec['compile_s']:.1f}s, step {rec['step_s'] * 1e3:.1f} ms, trace {rec['lower_s']:.1f}s, "
      f"wall {rec['wall_s']:.1f}s on {rec['backend']}"
    )
  if rec["status"] == "timeout":
    return f"timed out after {rec['timeout_s']:.0f}s"
  return f"{rec['status']}: " + rec.get("error", "").replace("\n", " | ")[-300:]


def probe(args: argparse.Namespace, log=print) -> dict:
  """Runs the candidates within the budget; writes probe.json and xla_flags.txt; returns the report."""
  t_start = time.monotonic()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  env, base = dict(os.environ), os.environ.get("XLA_FLAGS", "")
  names = candidate_names(args.candidates, expects_gpu(env))
  report: dict[str, Any] = {
    "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
    "base_xla_flags": base,
    "rule": RULE,
    "candidates": [],
    "chosen": None,
    "xla_flags": None,
  }
  log(f"[probe] {args.preset} at {args.layers} layer(s), {args.recipe}, batch {args.batch} x seq {args.seq}: {names}")
  attention, backend = args.attention, None
  for name in names:
    left = args.budget - (time.monotonic() - t_start)
    if CANDIDATES[name][1] and backend not in (None, "gpu"):
      rec = {"name": name, "xla_flags": with_base(name, base), "status": "skipped", "error": f"backend {backend}"}
    elif left < MIN_CANDIDATE_S:
      rec = {"name": name, "xla_flags": with_base(name, base), "status": "skipped", "error": "no time left"}
    else:
      rec = run_candidate(name, child_argv(args, attention), env, min(args.timeout, left))
    if rec["status"] == "ok":
      attention, backend = rec["attention"], rec["backend"]  # resolved once, passed on
    report["candidates"].append(rec)
    log(f"[probe] {name}: {describe(rec)}")
    write_report(out, report)
  chosen = choose(report["candidates"], args.slack)
  xla_flags = with_base(chosen, base)
  report |= {"chosen": chosen, "xla_flags": xla_flags, "total_s": round(time.monotonic() - t_start, 2)}
  write_report(out, report)
  (out / "xla_flags.txt").write_text(xla_flags + "\n")
  log(f"[probe] chosen: {report['chosen']} (XLA_FLAGS={report['xla_flags']!r}) after {report['total_s']:.1f}s")
  return report


def write_report(out: pathlib.Path, report: dict) -> None:
  (out / "probe.json").write_text(json.dumps(report, indent=1) + "\n")


# --- command line -------------------------------------------------------------------------------


def vocab_of(data: str) -> int:
  return int(json.loads((pathlib.Path(data) / "meta.json").read_text())["vocab_size"])


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m research.compile_probe", description=__doc__.split("\n")[0])
  p.add_argument("--out", help="folder for probe.json and xla_flags.txt")
  p.add_argument("--data", help="token folder (its meta.json gives the vocabulary), or --vocab")
  p.add_argument("--vocab", type=int, default=0)
  p.add_argument("--preset", default="paper-12l")
  p.add_argument("--layers", type=int, default=1, help="layers of the sliced preset")
  p.add_argument("--recipe", default="s3r_ec_dx")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=2048)
  p.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn"))
  p.add_argument("--tp-partial-sums", default="bf16", choices=("bf16", "int32"))
  p.add_argument("--schedule-steps", type=int, default=2000, help="the run's --steps (a constant of its program)")
  p.add_argument("--timed-steps", type=int, default=3, help="timed steps after the first call (median)")
  p.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate")
  p.add_argument("--budget", type=float, default=90.0, help="seconds for all candidates")
  p.add_argument("--slack", type=float, default=1.5, help="step time allowed, relative to the default's")
  p.add_argument("--candidates", default="", help=f"comma-separated, of {', '.join(CANDIDATES)} (default: by backend)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # measure one candidate, in this process
  return p


def main(argv: list[str] | None = None) -> int:
  p = parser()
  args = p.parse_args(argv)
  if not args.vocab:
    if not args.data:
      p.error("give --data (a token folder) or --vocab")
    args.vocab = vocab_of(args.data)
  if args.child:
    print(RESULT_PREFIX + json.dumps(measure(args)), flush=True)
    return 0
  if not args.out:
    p.error("--out is required")
  probe(args, log=lambda msg: print(msg, flush=True))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
