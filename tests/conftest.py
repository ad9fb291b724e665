"""Settings for the whole suite.

JAX's persistent compilation cache, one folder per pytest run, shared by the test processes and
by every subprocess they start (the CLI, the device scripts, multi-process workers): many tests
compile the same small programs (the `tiny` preset's train and eval steps, in-process and through
`s3r train`), and a hit costs milliseconds where the compile costs seconds. Each run starts with an
empty folder, so nothing carries over between runs. `S3R_TEST_JAX_CACHE=0` compiles everything
afresh; a `JAX_COMPILATION_CACHE_DIR` already set is used as it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile

CACHE_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")  # what subprocesses keep
_OWNED: list[str] = []


def pytest_configure(config):
  if hasattr(config, "workerinput"):  # an xdist worker inherits the controller's environment
    return
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
