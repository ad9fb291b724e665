"""JAX's persistent compilation cache for training runs: a repeated or resumed run loads its compiled
programs instead of compiling them again.

`enable(folder)` points JAX's cache at `folder` (`jax_compilation_cache_dir`), unless the process
already names one through `JAX_COMPILATION_CACHE_DIR`, which is kept. Programs that compile in under
`jax_persistent_cache_min_compile_time_secs` (JAX's default, 1 s) are not written. `loads()` counts
the programs this process loaded from the cache (JAX's `/jax/compilation_cache/cache_hits` event), so
a caller can say whether a compile came from the cache: compare the count before and after.
"""

from __future__ import annotations

import os
import threading

import jax

ENV = "JAX_COMPILATION_CACHE_DIR"
HIT_EVENT = "/jax/compilation_cache/cache_hits"
_hits = 0
_lock = threading.Lock()
_listening = False


def _on_event(event: str, **_kwargs) -> None:
  global _hits
  if event == HIT_EVENT:
    with _lock:
      _hits += 1


def _listen() -> None:
  global _listening
  if not _listening:
    jax.monitoring.register_event_listener(_on_event)
    _listening = True


def enable(folder: str) -> str:
  """Uses JAX's persistent compilation cache in `folder` (created if needed), or in the folder that
  $JAX_COMPILATION_CACHE_DIR names; returns the folder in use."""
  _listen()
  if os.environ.get(ENV):
    folder = os.environ[ENV]
  else:
    os.makedirs(folder, exist_ok=True)
  _set(True, folder)
  return folder


def disable() -> None:
  """No persistent compilation cache in this process (every program compiles), $JAX_COMPILATION_CACHE_DIR
  notwithstanding."""
  _set(False, None)


def _set(enabled: bool, folder: str | None) -> None:
  """JAX decides once per process whether it uses the cache (on the first compile): where the setting
  changes, that decision is reset (`compilation_cache.reset_cache`, where this JAX has it)."""
  from jax._src import compilation_cache

  before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
  if before == (enabled, folder if enabled else before[1]):
    return
  jax.config.update("jax_enable_compilation_cache", enabled)
  if enabled:
    jax.config.update("jax_compilation_cache_dir", folder)
  if hasattr(compilation_cache, "reset_cache"):
    compilation_cache.reset_cache()


def loads() -> int:
  """Programs this process has loaded from the persistent compilation cache (0 before `enable`)."""
  _listen()
  return _hits
