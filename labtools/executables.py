"""Train steps compiled ahead of time for a GPU target on a machine without one, and loaded on the GPU.

`python -m benchmarks aot --program lockstep --save-executables DIR` compiles the lockstep run's train
steps for a GPU target ("deviceless", `labtools.lockstep.lower_train_step`) and writes, per recipe,
`<recipe>.xla` (XLA's serialized executable, `jax.experimental.serialize_executable`) and
`<recipe>.trees` (its argument and result structures), and `manifest.json` with the SHA-256 of the
program's lowering, the target, JAX's version and the compiler options. On the device the lockstep run
(`--precompiled DIR`) lowers each step as always, and loads the saved executable instead of compiling
only when the lowering's hash, JAX's version and the platform match; anything else (a missing file, a
mismatch, an error while loading) is logged and the step is compiled as usual. Autotuning needs the GPU,
so a saved program has XLA's default GEMM tilings (compiled with `xla_gpu_autotune_level=0`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import pickle
from typing import Any

MANIFEST = "manifest.json"


@contextlib.contextmanager
def fresh_compiles():
  """Compiles in this block skip JAX's persistent compilation cache: an executable read back from that
  cache can lack the code a serialization needs (seen on XLA:CPU: "Function ... not found" when the
  saved program runs in another process)."""
  import jax

  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)


def fingerprint(lowered) -> str:
  """SHA-256 of the lowered program (StableHLO text without source locations)."""
  return hashlib.sha256(lowered.as_text(debug_info=False).encode()).hexdigest()


def save(folder: pathlib.Path, name: str, lowered, compiled, info: dict[str, Any]) -> dict:
  """Writes one compiled program under `name` and its line in the manifest; returns the line. Compile it
  under `fresh_compiles()`."""
  import jax
  from jax.experimental import serialize_executable

  folder.mkdir(parents=True, exist_ok=True)
  payload, in_tree, out_tree = serialize_executable.serialize(compiled)
  (folder / f"{name}.xla").write_bytes(payload)
  (folder / f"{name}.trees").write_bytes(pickle.dumps((in_tree, out_tree)))
  entry = {
    "fingerprint": fingerprint(lowered),
    "bytes": len(payload),
    "sha256": hashlib.sha256(payload).hexdigest(),
    "jax": jax.__version__,
    "platform": compiled_platform(compiled),
    **info,
  }
  path = folder / MANIFEST
  manifest = json.loads(path.read_text()) if path.is_file() else {}
  manifest[name] = entry
  path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
  return entry


def compiled_platform(compiled) -> str:
  """The platform of the devices a compiled program runs on ("cuda", "cpu", ...)."""
  import jax

  shardings = jax.tree.leaves(compiled.input_shardings)
  return next(iter(shardings[0].device_set)).platform if shardings else "unknown"


def load(folder: pathlib.Path, name: str, lowered) -> tuple[Any | None, str]:
  """(the executable saved under `name`, loaded for this process's devices, "") when it is the program
  `lowered` describes, for this JAX and platform; else (None, why not)."""
  import jax
  from jax.experimental import serialize_executable

  path = folder / MANIFEST
  if not path.is_file():
    return None, f"no {MANIFEST} in {folder}"
  entry = json.loads(path.read_text()).get(name)
  if entry is None:
    return None, f"{folder} has no program {name}"
  platform = jax.devices()[0].platform
  if entry["jax"] != jax.__version__ or entry["platform"] != platform:
    return (
      None,
      f"{name} was compiled by JAX {entry['jax']} for {entry['platform']}; this is JAX {jax.__version__} on {platform}",
    )
  if entry["fingerprint"] != fingerprint(lowered):
    return (
      None,
      f"{name}: this process lowers a different program than the one saved (settings, attention or code differ)",
    )
  payload = (folder / f"{name}.xla").read_bytes()
  if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
    return None, f"{name}.xla does not match its manifest (damaged or replaced)"
  try:
    in_tree, out_tree = pickle.loads((folder / f"{name}.trees").read_bytes())
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree), ""
  except Exception as e:  # a runtime that cannot load it: compiling is the way on
    return None, f"{name}: loading failed ({type(e).__name__}: {str(e).strip()[:200]})"
