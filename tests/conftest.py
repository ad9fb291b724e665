"""Settings for the whole suite.

JAX's persistent compilation cache, one folder per pytest run, shared by the test processes and
by every subprocess they start (the CLI, the device scripts, multi-process workers): many tests
compile the same small programs (the `tiny` preset's train and eval steps, in-process and through
`s3r train`), and a hit costs milliseconds where the compile costs seconds. Each run starts with an
empty folder, so nothing carries over between runs. `S3R_TEST_JAX_CACHE=0` compiles everything
afresh; a `JAX_COMPILATION_CACHE_DIR` already set is used as it is.

XLA compiles the suite's programs at backend optimization level 0 (`TEST_XLA_FLAGS`, added to
XLA_FLAGS for every test process and subprocess): the suite's models are tiny, so compiling is
most of its time, and level 0 roughly halves it. What the tests compare is computed under the same
flag on both sides (bitwise comparisons are within one setting); results and benchmarks are not
produced by the suite. `S3R_TEST_XLA_OPT=1` keeps XLA's default level.
"""

from __future__ import annotations

import os
import shutil
import tempfile

CACHE_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")  # what subprocesses keep
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
_OWNED: list[str] = []


def xla_flags(*extra: str) -> str:
  """XLA_FLAGS for a test subprocess: the suite's compile settings (unless turned off) plus `extra`."""
  suite = TEST_XLA_FLAGS if os.environ.get("S3R_TEST_XLA_OPT", "0") != "1" else ""
  return " ".join(f for f in (suite, *extra) if f)


def pytest_configure(config):
  if hasattr(config, "workerinput"):  # an xdist worker inherits the controller's environment
    return
  flags, present = xla_flags(), os.environ.get("XLA_FLAGS", "")
  if flags and flags not in present:
    os.environ["XLA_FLAGS"] = f"{present} {flags}".strip()
  if os.environ.get("S3R_TEST_JAX_CACHE", "1") == "0" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  folder = tempfile.mkdtemp(prefix="s3r-test-jax-cache-")
  _OWNED.append(folder)
  cache_dir, min_compile_time = CACHE_ENV
  os.environ[cache_dir] = folder
  os.environ.setdefault(min_compile_time, "0.1")


def pytest_unconfigure(config):
  for folder in _OWNED:
    shutil.rmtree(folder, ignore_errors=True)
