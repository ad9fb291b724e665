"""`s3r train` keeps its compiled programs in JAX's persistent compilation cache (<cache-dir>/xla by default):
a repeated run loads them, and says so; --no-compile-cache compiles afresh."""

from __future__ import annotations

import subprocess

import jax
import pytest

from s3r.train.run import compile_cache


def _train(cli, out, cache, *extra) -> subprocess.CompletedProcess:
  """A one-step run with the token cache and compiled programs in `cache`, no suite-wide compilation cache."""
  env = {k: v for k, v in cli.env.items() if k != compile_cache.ENV}
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny steps compile in under JAX's 1 s
  args = cli.train_args(out, "--steps", "1", "--eval-every", "1", "--ckpt-every", "1", *extra)
  i = args.index("--cache-dir")
  args[i + 1] = cache
  return subprocess.run(cli.argv(*args), capture_output=True, text=True, env=env, timeout=300)


def _compiled_lines(proc) -> list[str]:
  return [line for line in proc.stdout.splitlines() if line.startswith("compiled the ")]


@pytest.mark.slow
def test_a_repeated_run_loads_its_steps_from_the_compilation_cache_and_says_so(cli, tmp_path):
  cache = tmp_path / "cache"
  first = _train(cli, tmp_path / "a", cache)
  assert first.returncode == 0, first.stderr[-3000:]
  assert _compiled_lines(first) and not any("from the compilation cache" in s for s in _compiled_lines(first))
  assert any((cache / "xla").iterdir()), "nothing was written to <cache-dir>/xla"
  second = _train(cli, tmp_path / "b", cache)
  assert second.returncode == 0, second.stderr[-3000:]
  lines = _compiled_lines(second)
  assert any(s.startswith("compiled the train step in ") and s.endswith("(from the compilation cache)") for s in lines)


@pytest.mark.slow
def test_no_compile_cache_compiles_afresh_and_writes_nothing(cli, tmp_path):
  cache = tmp_path / "cache"
  assert _train(cli, tmp_path / "a", cache).returncode == 0
  proc = _train(cli, tmp_path / "b", cache, "--no-compile-cache")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _compiled_lines(proc) and not any("from the compilation cache" in s for s in _compiled_lines(proc))


def test_disable_turns_off_the_cache_that_enable_turned_on(tmp_path, monkeypatch):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
  try:
    assert compile_cache.enable(str(tmp_path / "xla")) == str(tmp_path / "xla")
    assert jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    compile_cache.disable()
    assert not jax.config.jax_enable_compilation_cache
  finally:
    jax.config.update("jax_enable_compilation_cache", before[0])
    jax.config.update("jax_compilation_cache_dir", before[1])
    from jax._src import compilation_cache as cc

    cc.reset_cache()
