"""Per-kernel device times from a `jax.profiler` trace, each mapped to the instruction of the optimized HLO that
launched it.

A trace (`s3r.train.run.profiling.trace`) is an XSpace (`<folder>/plugins/profile/<session>/<host>.xplane.pb`),
read with JAX's own reader of it (`jax._src.lib._profile_data`). Where the kernels are:
- on a GPU, on the planes `/device:GPU:<n>`, one line per CUDA stream (`Stream #<id>(...)`), one event per
  kernel launch or copy; lines that tools derive from those (`XLA Ops`, `XLA Modules`, `Steps`, ...) are
  skipped, so nothing is counted twice;
- on the CPU (the dry runs), XLA:CPU's per-thunk events on the host plane (with
  `--xla_cpu_enable_xprof_traceme`, see `benchmarks.profile`), named after the HLO instructions.

Which instruction an event belongs to (`hlo_name`), first match wins: the event's `hlo_op` stat (XLA:GPU
annotates every kernel it launches, cuBLAS's and cuDNN's included, with the instruction's name), an
`hlo_op=NAME` inside any string stat (an annotation not yet split into stats), the event's name itself, or
the name with `.` and `-` written as `_` (XLA:GPU names a fusion's kernel after the fusion that way).
Events matching no instruction are kept under their own names (`hlo: false`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import warnings
from collections import defaultdict

# lines of a device plane that trace viewers derive from the stream lines (never counted)
DERIVED_LINES = ("XLA Ops", "XLA Modules", "Steps", "Framework", "Source code", "Launch Stats", "TensorFlow")
_HLO_OP_RE = re.compile(r"\bhlo_op=([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Event:
  name: str  # the event's (kernel's) name
  seconds: float
  stats: dict
  plane: str
  line: str


def read_events(path: str | pathlib.Path) -> list[Event]:
  """Every event of one .xplane.pb trace file."""
  from jax._src.lib import _profile_data

  data = _profile_data.ProfileData.from_file(str(path))
  return _events(data)


def events_from_text_proto(text: str) -> list[Event]:
  """Every event of an XSpace given as a text proto (tests build small GPU traces this way)."""
  from jax._src.lib import _profile_data

  return _events(_profile_data.ProfileData.from_text_proto(text))


def _events(data) -> list[Event]:
  out = []
  with warnings.catch_warnings():  # the reader's stats type lacks a __module__ (a DeprecationWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    for plane in data.planes:
      for line in plane.lines:
        for ev in line.events:
          out.append(Event(ev.name, ev.duration_ns / 1e9, dict(ev.stats), plane.name, line.name))
  return out


def is_device_event(event: Event) -> bool:
  """A kernel or copy on a GPU's stream line (not a derived line, not the host)."""
  if not event.plane.startswith("/device:GPU:"):
    return False
  return not any(event.line.startswith(d) for d in DERIVED_LINES)


def _normal(name: str) -> str:
  return name.replace(".", "_").replace("-", "_")


def hlo_name(event: Event, names: set[str], normal: dict[str, str] | None = None) -> str | None:
  """The HLO instruction of `names` that `event` belongs to (see the module docstring), or None."""
  op = event.stats.get("hlo_op")
  if isinstance(op, str) and op in names:
    return op
  for value in event.stats.values():
    if isinstance(value, str) and (m := _HLO_OP_RE.search(value)) and m.group(1) in names:
      return m.group(1)
  if event.name in names:
    return event.name
  normal = normal if normal is not None else {_normal(n): n for n in names}
  return normal.get(_normal(event.name))


def hlo_instruction_names(hlo_text: str) -> set[str]:
  """The instruction names of an optimized HLO module (`compiled.as_text()`)."""
  return set(re.findall(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=", hlo_text, flags=re.M))


def kernel_table(events: list[Event], hlo_text: str, calls: int, platform: str = "gpu") -> dict:
  """Per-call device seconds and counts of the kernels of `calls` traced program calls, grouped by the HLO
  instruction that launched them (by kernel name where none matches).

  `platform` "gpu": the device events (`is_device_event`); "cpu": XLA:CPU's thunk events, which are the host
  events named after an instruction of the module. Returns {"kernels": [{name, hlo, seconds, count,
  kernel_names}] (largest first), "seconds": the sum, "unmapped_seconds": of the events no instruction
  matched}."""
  names = hlo_instruction_names(hlo_text)
  normal = {_normal(n): n for n in names}
  seconds: defaultdict[str, float] = defaultdict(float)
  counts: defaultdict[str, int] = defaultdict(int)
  kernels: defaultdict[str, set] = defaultdict(set)
  mapped: dict[str, bool] = {}
  for ev in events:
    if platform == "gpu" and not is_device_event(ev):
      continue
    name = hlo_name(ev, names, normal)
    if platform != "gpu" and name is None:
      continue  # host events that are not thunks (Python, the runtime)
    key = name or ev.name
    mapped[key] = name is not None
    seconds[key] += ev.seconds
    counts[key] += 1
    kernels[key].add(ev.name)
  rows = [
    {
      "name": k,
      "hlo": mapped[k],
      "seconds": seconds[k] / calls,
      "count": counts[k] / calls,
      "kernel_names": sorted(kernels[k])[:3],
    }
    for k in sorted(seconds, key=lambda k: -seconds[k])
  ]
  return {
    "kernels": rows,
    "seconds": sum(r["seconds"] for r in rows),
    "unmapped_seconds": sum(r["seconds"] for r in rows if not r["hlo"]),
  }
