"""Helpers of the distributed tests: run a program of workers.py with simulated host devices."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import CACHE_ENV, xla_flags

WORKERS = pathlib.Path(__file__).with_name("workers.py")
REPO = WORKERS.parents[2]


def device_env(n_devices: int, **extra) -> dict:
  """The environment of a subprocess with `n_devices` simulated CPU devices."""
  keep = ("JAX_ENABLE_X64", *CACHE_ENV)  # and the suite's compilation cache
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k in keep}
  env.update(
    {
      "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={n_devices}"),
      "JAX_PLATFORMS": "cpu",
      "PYTHONPATH": str(REPO),
    },
    **extra,
  )
  return env


def run_worker(name: str, out: pathlib.Path, *args: str, n_devices: int = 8, timeout: float = 600) -> dict:
  """Runs `workers.py name out args...` with `n_devices` devices; returns its result.json."""
  out.mkdir(parents=True, exist_ok=True)
  proc = subprocess.run(
    [sys.executable, str(WORKERS), name, str(out), *args],
    env=device_env(n_devices),
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="session")
def mesh_train_losses(tmp_path_factory) -> dict:
  """3 `tiny` train steps (s3r_ec) on one device and on 8 devices as pure TP and data x fsdp x
  tensor with exact int32 tensor-parallel partial sums (':int32'), and pure TP with the default
  per-shard bf16 ones: losses, gradient norms, a weight's sharding, the collectives, and (1
  device, 2x2x2) the step Δ of every projection in the first step."""
  out = tmp_path_factory.mktemp("mesh_train")
  result = run_worker(
    "train", out, "s3r_ec", "3", "1+delta", "tensor=8:int32", "data=2,fsdp=2,tensor=2:int32+delta", "tensor=8"
  )
  return {**result, "_out": str(out)}


@pytest.fixture(scope="session")
def fsdp_train(tmp_path_factory) -> dict:
  """The same 3 steps on one device and as pure FSDP over 8 devices (a worker of its own: slow tests only)."""
  return run_worker("train", tmp_path_factory.mktemp("fsdp_train"), "s3r_ec", "3", "1", "fsdp=8")


@pytest.fixture(scope="session")
def sharded_cli_run(tmp_path_factory) -> dict:
  """`s3r train` of `tiny` on a 4x2 mesh of 8 devices, resumed on 2x4 and on one device (see
  test_checkpoint_reshard.py); its corpus and cache serve the multi-process test."""
  from tests.train.conftest import write_corpus

  corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
  cache = tmp_path_factory.mktemp("cache")
  out = tmp_path_factory.mktemp("checkpoint_reshard")
  result = run_worker("checkpoint", out, str(corpus), str(cache))
  return {"result": result, "out": out, "corpus": corpus, "cache": cache}


@pytest.fixture(scope="session")
def tp_runs(tmp_path_factory) -> dict:
  """One qmatmul on tensor=8 with bf16 and with exact partial sums (workers.tp_worker)."""
  import numpy as np

  out = tmp_path_factory.mktemp("tp")
  info = run_worker("tp", out)
  return {"info": info, "arrays": dict(np.load(out / "tp.npz"))}
