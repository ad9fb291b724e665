"""One deviceless compile of `python -m benchmarks aot`: the compiler options (`--xla`), the target's mesh, and
`measure` (lower, compile, the seconds and CPU seconds of each, memory, the GEMM census, optionally XLA's own pass
timers and the optimized HLO text)."""

import contextlib
import gzip
import os
import tempfile
import time

from benchmarks import aot_report
from benchmarks.aot_targets import use_cpu_host as _use_cpu_host
from labtools import executables

DEFAULT_COMPILER_OPTIONS: dict[str, bool | int | float | str] = {"xla_gpu_autotune_level": 0}
# XLA's C++ sources whose log lines time the HLO passes, the backend, LLVM-to-PTX and ptxas
XLA_TIMER_MODULES = "hlo_pass_pipeline=1,gpu_compiler=1,nvptx_compiler=1"


def use_cpu_host(xla_timers: bool = False) -> None:
  """This process compiles for the target but runs on the CPU (see `aot_targets.use_cpu_host`); `xla_timers`: XLA
  logs the time of every HLO pass and of code generation (read by `measure`)."""
  _use_cpu_host(xla_timers, XLA_TIMER_MODULES)


def target_mesh(devices: list):
  """The trainer's mesh (axes s3r.train.step.sharding.MESH_AXES) over one target device."""
  import numpy as np
  from jax.sharding import Mesh

  from s3r.train.step import sharding

  return Mesh(np.asarray(devices[:1]).reshape((1,) * len(sharding.MESH_AXES)), sharding.MESH_AXES)


def compiler_options(pairs: list[str] | None, tpu: bool = False) -> dict[str, bool | int | float | str]:
  """DEFAULT_COMPILER_OPTIONS (a GPU target's; none for a TPU) updated by `--xla NAME=VALUE` pairs (a leading
  `--` and `xla_` prefix kept)."""
  out = {} if tpu else dict(DEFAULT_COMPILER_OPTIONS)
  for pair in pairs or []:
    name, sep, value = pair.lstrip("-").partition("=")
    if not sep or not name.startswith("xla_"):
      raise SystemExit(
        f"--xla {pair}: expected NAME=VALUE with an XLA option name, e.g. xla_gpu_enable_triton_gemm=false"
      )
    out[name] = _option_value(value)
  return out


def _option_value(text: str) -> bool | int | float | str:
  """An XLA option's value as XLA takes it through JAX's compiler_options: true/false as bools, numbers as numbers."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def cpu_seconds() -> float:
  """CPU seconds of this process (all threads) and of its finished children (XLA:GPU runs ptxas): under load,
  a compile's CPU time varies less than its wall-clock time."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


@contextlib.contextmanager
def stderr_captured(enabled: bool):
  """Yields a function returning what the process wrote to file descriptor 2 meanwhile (XLA's C++ logs)."""
  if not enabled:
    yield lambda: ""
    return
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+") as f:
    os.dup2(f.fileno(), 2)
    try:
      yield lambda: (f.seek(0), f.read())[1]
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def measure(
  lower, options_: dict, breakdown: bool, xla_timers: bool = False, keep=None, tpu: bool = False, hlo_to=None
) -> dict:
  """Lowers and compiles one program; its seconds, memory, GEMM kinds and (optionally) peak buffers and
  XLA's own compile timers. `keep(lowered, compiled)`, if given, gets the program, which is then compiled
  here and never read back from the persistent cache (`executables.fresh_compiles`). `hlo_to`: a path
  that gets the optimized HLO text, gzip-compressed (what `python -m benchmarks perfmodel` reads)."""
  t0, cpu0 = time.perf_counter(), cpu_seconds()
  lowered = lower()
  fresh = executables.fresh_compiles() if keep is not None else contextlib.nullcontext()
  with fresh, stderr_captured(xla_timers) as logged:
    t1, cpu1 = time.perf_counter(), cpu_seconds()
    compiled = lowered.compile(compiler_options=options_)
    t2, cpu2 = time.perf_counter(), cpu_seconds()
    log_text = logged()
  if keep is not None:
    keep(lowered, compiled)
  text = compiled.as_text()
  if hlo_to is not None:
    hlo_to.parent.mkdir(parents=True, exist_ok=True)
    hlo_to.write_bytes(gzip.compress(text.encode(), mtime=0))
  row = {
    "lower_s": t1 - t0,
    "lower_cpu_s": cpu1 - cpu0,
    "compile_s": t2 - t1,
    "compile_cpu_s": cpu2 - cpu1,
    "memory": aot_report.memory(compiled),
    "hlo": aot_report.hlo_summary(text, tpu=tpu),
  }
  if xla_timers:
    row["xla_timers"] = aot_report.xla_timers(log_text)
  if breakdown:
    from labtools.analysis import memory as memory_analysis

    found, _ = memory_analysis.buffer_breakdown(lowered, compiler_options=options_)
    found["peak"] = found["peak"][: aot_report.BREAKDOWN_ROWS]
    del found["temp_values"]
    row["breakdown"] = found
  return row
