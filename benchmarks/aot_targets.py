"""The targets of `python -m benchmarks aot` and `python -m benchmarks perfmodel`: the compile-only devices of an
H100, an H200 (XLA's published GpuTargetConfigProto text in benchmarks/targets/) or a TPU v5p (libtpu's topology),
and the process settings a deviceless compile needs. Imports nothing from s3r, so that a program of another
revision of the library can be compiled with it."""

from __future__ import annotations

import importlib.util
import os
import pathlib

TARGETS_DIR = pathlib.Path(__file__).parent / "targets"
TARGETS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb"}
TPU_TARGETS = {"v5p": "v5p:2x2x1"}  # --target: libtpu's topology name (the programs use its first chip)
PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
MISSING_EXTRA = (
  "python -m benchmarks aot needs JAX's CUDA plugin (no GPU needed): install the optional extra with\n"
  "  pip install -e '.[gpu-aot]' -c constraints.txt\n"
  "(about 4.3 GB of NVIDIA wheels, at the pinned JAX; see docs/performance-gpu.md, 'GPU programs compiled on the CPU')"
)
MISSING_TPU_EXTRA = (
  "python -m benchmarks aot --target v5p needs libtpu (no TPU needed): install the optional extra, in an "
  "environment of its own, with\n"
  "  pip install -e '.[tpu-aot]' -c constraints.txt\n"
  "(libtpu at the pinned JAX; see docs/performance-tpu.md, 'TPU v5p programs compiled on the CPU')"
)


def cuda_plugin_installed() -> bool:
  """Whether JAX's CUDA plugin (the `gpu-aot` extra) can be imported."""
  for name in PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except ModuleNotFoundError:
      continue
  return False


def tpu_plugin_installed() -> bool:
  """Whether libtpu (the `tpu-aot` extra) can be imported."""
  try:
    return importlib.util.find_spec("libtpu") is not None
  except ModuleNotFoundError:
    return False


def is_tpu(target: str) -> bool:
  return target in TPU_TARGETS


def use_cpu_host(xla_timers: bool = False, timer_modules: str = "") -> None:
  """This process compiles for the GPU target but runs on the CPU: JAX's own backend is the CPU (set
  before any backend starts), and the CUDA plugin does not check the CUDA libraries against a driver.
  `xla_timers`: XLA logs the time of every HLO pass and of code generation (read by `measure`)."""
  import jax
  from jax._src import xla_bridge

  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if xla_timers:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    os.environ["TF_CPP_VMODULE"] = timer_modules
  if not xla_bridge._backends:  # noqa: SLF001 - the platforms can only change before the first backend
    jax.config.update("jax_platforms", "cpu")


def target_spec(target: str) -> str:
  """The GpuTargetConfigProto text of `target` (a name of TARGETS or the path of a .txtpb file)."""
  path = TARGETS_DIR / TARGETS[target] if target in TARGETS else pathlib.Path(target)
  if not path.is_file():
    raise SystemExit(f"--target {target}: not one of {', '.join(TARGETS)} and not a file")
  return path.read_text()


def target_devices(target: str) -> list:
  """The compile-only devices of one GPU of `target`, or of the TPU topology of a TPU target."""
  from jax.experimental import topologies

  if is_tpu(target):
    # compile-only: no TPU is opened, so libtpu's one-process-per-host lock has nothing to guard (and would
    # refuse a second compiling process)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return list(topologies.get_topology_desc(TPU_TARGETS[target], "tpu").devices)
  topo = topologies.get_topology_desc(
    platform="cuda", topology_name="", topology="1x1x1", target_config=target_spec(target)
  )
  return list(topo.devices)
