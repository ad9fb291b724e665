"""Train steps compiled ahead of time and loaded by the lockstep run (labtools/executables.py), on the CPU:
the program `python -m benchmarks aot --program lockstep` compiles is the one the run lowers (same
fingerprint), a run given those programs loads them instead of compiling and trains to the same losses,
and a program of other settings is not loaded but compiled, with the reason in the log."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from labtools import executables
from research import lockstep
from tests.research.conftest import precompile_lockstep_here

RECIPES = ("int8_sr", "s3r")


def _cfg(token_folder, out, **kw) -> lockstep.LockstepConfig:
  base: dict[str, Any] = dict(data=str(token_folder), out=str(out), preset="tiny", recipes=RECIPES, steps=4)
  base |= dict(batch=2, seq=16, lr=3e-3, warmup=1, eval_every=2, eval_batches=2, time_budget=600.0, dose_keys=0)
  return lockstep.LockstepConfig(**{**base, **kw})


@pytest.mark.slow
def test_a_run_loads_the_programs_compiled_ahead_and_trains_to_the_same_losses(token_folder, tmp_path):
  precompile_lockstep_here(tmp_path / "programs", RECIPES, seq=16)
  compiled_here = lockstep.run(_cfg(token_folder, tmp_path / "a"), log=lambda _: None)
  lines = []
  loaded = lockstep.run(_cfg(token_folder, tmp_path / "b", precompiled=str(tmp_path / "programs")), log=lines.append)
  assert [x for x in lines if "loaded the program compiled ahead" in x] and not [
    x for x in lines if "compiling here" in x
  ]
  assert set(loaded["loaded_s_by_recipe"]) == set(RECIPES) and loaded["compile_s_by_recipe"] == {}
  assert loaded["curves"] == compiled_here["curves"]


@pytest.mark.slow
def test_a_program_of_other_settings_is_compiled_not_loaded_and_the_log_says_why(token_folder, tmp_path):
  precompile_lockstep_here(tmp_path / "programs", ("int8_sr",), seq=32)
  lines = []
  summary = lockstep.run(_cfg(token_folder, tmp_path / "b", precompiled=str(tmp_path / "programs")), log=lines.append)
  assert any("int8_sr: compiling here" in x and "different program" in x for x in lines), lines
  assert any("s3r: compiling here" in x and "has no program s3r" in x for x in lines), lines
  assert summary["loaded_s_by_recipe"] == {} and set(summary["compile_s_by_recipe"]) == set(RECIPES)


def test_a_damaged_program_is_refused_before_loading(tmp_path):
  lowered = jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((3,), np.float32))
  executables.save(tmp_path, "p", lowered, lowered.compile(), {})
  program, why = executables.load(tmp_path, "p", lowered)
  assert program is not None and why == "" and list(program(np.zeros(3, np.float32))) == [1, 1, 1]
  (tmp_path / "p.xla").write_bytes(b"x" + (tmp_path / "p.xla").read_bytes()[1:])
  program, why = executables.load(tmp_path, "p", lowered)
  assert program is None and "damaged" in why
