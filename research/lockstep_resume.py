"""Resume points of a lockstep run, so a stopped run continues from its last evaluation instead of
from step 0.

At every scheduled evaluation the runner writes `resume.npz` (every recipe's train state: step
counter, parameters, optimizer state, bit for bit) and then `resume.json` (the step, the loader's
position, the schedule, the curve so far and the iteration times; written last, so it only ever
names a complete `resume.npz`). A continued run is the same computation as an uninterrupted one:
the train step derives its quantizer keys from the state's step counter, the loader replays the
same batches from its restored position, and the schedule is the one the run started with (a
`fit_budget` run does not fit it again). Both files go when the run reaches the end of its schedule.

A resume point written with other settings is refused (`ValueError` naming the fields): it is another
experiment. Only fields that cannot change the trajectory may differ (`IGNORED`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

FILES = ("resume.json", "resume.npz")
# where and how long, not what (a program compiled ahead of time is loaded only for the same lowering)
IGNORED = ("out", "time_budget", "margin", "compile_threads", "precompiled")


def _settings(cfg) -> dict[str, Any]:
  """The config fields that decide the trajectory, as JSON values."""
  fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in IGNORED}
  return json.loads(json.dumps(fields))


def save(
  out: pathlib.Path,
  cfg,
  *,
  step: int,
  states: dict,
  loader: dict,
  schedule: dict,
  records: list,
  iter_times: list[float],
  segments: list[dict],
) -> None:
  """Writes the resume point of `step` (the npz first, then the json that names it)."""
  arrays = {f"{r}/{i}": np.asarray(x) for r, s in states.items() for i, x in enumerate(jax.tree.leaves(s))}
  arrays["step"] = np.asarray(step, np.int64)
  tmp = out / "resume.npz.tmp"
  with tmp.open("wb") as f:
    np.savez(f, allow_pickle=False, **arrays)
  os.replace(tmp, out / "resume.npz")
  meta = {
    "settings": _settings(cfg),
    "step": step,
    "loader": loader,
    "schedule": schedule,
    "records": records,
    "iter_times": iter_times,
    "segments": segments,
  }
  tmp = out / "resume.json.tmp"
  tmp.write_text(json.dumps(meta))
  os.replace(tmp, out / "resume.json")


def load(out: pathlib.Path, cfg, states: dict) -> dict | None:
  """The resume point in `out` with the states rebuilt on the shapes, dtypes and shardings of
  `states` (freshly initialised ones), or None when there is none."""
  path = out / "resume.json"
  if not path.is_file():
    return None
  meta = json.loads(path.read_text())
  want = _settings(cfg)
  differ = sorted(k for k in set(want) | set(meta["settings"]) if want.get(k) != meta["settings"].get(k))
  if differ:
    raise ValueError(
      f"{path} was written with other settings ({', '.join(differ)}): it is another experiment; "
      f"remove {', '.join(FILES)} from {out} to start from step 0"
    )
  with np.load(out / "resume.npz") as z:
    if int(z["step"]) != meta["step"]:
      raise ValueError(f"{out}: resume.npz holds step {int(z['step'])}, resume.json step {meta['step']}")
    restored = {}
    for r, state in states.items():
      leaves, treedef = jax.tree.flatten(state)
      new = []
      for i, x in enumerate(leaves):
        a = z[f"{r}/{i}"]
        if a.shape != x.shape or a.dtype != x.dtype:
          raise ValueError(f"{out}: {r} leaf {i} is {a.dtype}{list(a.shape)}, the model wants {x.dtype}{list(x.shape)}")
        new.append(jax.device_put(a, x.sharding))
      restored[r] = jax.tree.unflatten(treedef, new)
  return {**meta, "states": restored}


def clear(out: pathlib.Path) -> None:
  for name in FILES:
    (out / name).unlink(missing_ok=True)
