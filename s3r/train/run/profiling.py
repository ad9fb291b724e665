"""Profiler traces: `jax.profiler` traces of chosen training steps, one way for the trainer and the scripts.

A trace is a folder in TensorBoard's profile layout, `<folder>/plugins/profile/<session>/<host>.xplane.pb`
(plus `<host>.trace.json.gz` where asked), which the TensorBoard profile plugin and XProf open:
`xprof --logdir <folder>` or `tensorboard --logdir <folder>` (docs/training.md, "Profiling").

    from s3r.train.run import profiling

    with profiling.trace("runs/x/profile"):              # everything in the block
      step(...)

    steps = profiling.StepProfiler("runs/x/profile", profiling.parse_steps("10:12"))
    for step in range(1, n + 1):
      with steps.step(step):                              # traces steps 10, 11 and 12
        state = train_step(state, ...)
        steps.done(state)                                 # waits for the step's results before a trace ends

`StepProfiler` marks each traced step with `jax.profiler.StepTraceAnnotation` (the profile plugin's step view)
and ends the trace after the last one; `trace_files` and `event_names` read a trace back.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import warnings
from collections.abc import Iterator

import jax

PROFILE_DIR = "profile"  # a run's traces: <out>/profile
STEP_NAME = "train"  # the name of the step annotation of traced steps
_SPEC = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


class ProfileError(ValueError):
  """A bad START:STOP (the message names the flag)."""


def parse_steps(spec: str, *, flag: str = "--profile", last_step: int | None = None) -> tuple[int, int]:
  """ "START:STOP" -> (START, STOP): the steps START to STOP, both traced, 1 <= START <= STOP (<= last_step
  where given). ProfileError naming `flag` otherwise."""
  m = _SPEC.fullmatch(spec) if isinstance(spec, str) else None
  if m is None:
    raise ProfileError(f"{flag} must be START:STOP (steps, e.g. 10:12), got {spec!r}")
  start, stop = int(m.group(1)), int(m.group(2))
  if not 1 <= start <= stop:
    raise ProfileError(f"{flag} must be START:STOP with 1 <= START <= STOP, got {spec!r}")
  if last_step is not None and stop > last_step:
    raise ProfileError(f"{flag} {spec}: STOP must be at most the last step ({last_step})")
  return start, stop


def start(folder: str | pathlib.Path) -> pathlib.Path:
  """Starts a `jax.profiler` trace that `stop` writes into `folder` (created); returns the folder."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  jax.profiler.start_trace(str(folder))
  return folder


def stop() -> None:
  """Ends the trace `start` began and writes it."""
  jax.profiler.stop_trace()


@contextlib.contextmanager
def trace(folder: str | pathlib.Path) -> Iterator[pathlib.Path]:
  """A trace of the block into `folder` (the work a block dispatches but does not wait for may be cut off:
  block on its results inside)."""
  path = start(folder)
  try:
    yield path
  finally:
    stop()


class StepProfiler:
  """Traces the steps `steps` = (START, STOP) of a loop into `folder`: the trace starts before step START
  (or the first step after `resumed_at` when the run resumes inside the range) and ends after step STOP;
  `steps` None traces nothing. `planned` says whether anything is left to trace, `active` whether a trace
  is running now."""

  def __init__(self, folder: str | pathlib.Path, steps: tuple[int, int] | None, *, resumed_at: int = 0, log=None):
    self.folder = pathlib.Path(folder)
    self.log = log  # (str) -> None: told where the trace went when it ends
    self.first, self.last = (max(steps[0], resumed_at + 1), steps[1]) if steps else (1, 0)
    self.active = False
    self._pending = None

  @property
  def planned(self) -> bool:
    """Whether any step is left to trace."""
    return self.first <= self.last

  def describe(self) -> str:
    """One line for the log: what is traced into which folder."""
    if not self.planned:
      return f"profile: nothing to trace (the run is past step {self.last})"
    steps = f"step {self.first}" if self.first == self.last else f"steps {self.first}-{self.last}"
    return f"profile: tracing {steps} into {self.folder} (open with: xprof --logdir {self.folder})"

  @contextlib.contextmanager
  def step(self, step: int) -> Iterator[None]:
    """The body of step `step`: traced (and annotated) when in range; the trace ends after the last step."""
    if step == self.first and self.planned and not self.active:
      start(self.folder)
      self.active = True
    if not self.active:
      yield
      return
    try:
      with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
        yield
        if self._pending is not None:
          jax.block_until_ready(self._pending)
    finally:
      self._pending = None
      if step >= self.last:
        self.close()

  def done(self, outputs) -> None:
    """The step's outputs, waited for before the step's annotation (and a last step's trace) ends."""
    self._pending = outputs

  def close(self) -> None:
    """Ends a running trace (a loop that stops early keeps what was traced)."""
    if self.active:
      self.active = False
      stop()
      if self.log is not None:
        written = trace_files(self.folder)
        self.log(f"profile: wrote {written[-1] if written else self.folder}")


def run_folder(out: str | pathlib.Path) -> pathlib.Path:
  """Where a training run in `out` puts its traces: <out>/profile, or <out>/profile/process-<i> for each of
  several processes (their files never collide, also where processes share a host name)."""
  folder = pathlib.Path(out) / PROFILE_DIR
  return folder if jax.process_count() == 1 else folder / f"process-{jax.process_index()}"


def step_profiler(folder: str | pathlib.Path, spec: str | None, *, resumed_at: int = 0, log=None) -> StepProfiler:
  """The StepProfiler of the steps `spec` ("START:STOP", `parse_steps`; None traces nothing) into `folder`,
  resuming after step `resumed_at`; says what it will trace through `log`."""
  profiler = StepProfiler(folder, parse_steps(spec) if spec else None, resumed_at=resumed_at, log=log)
  if spec and log is not None:
    log(profiler.describe())
  return profiler


def trace_files(folder: str | pathlib.Path, suffix: str = ".xplane.pb") -> list[pathlib.Path]:
  """The trace files under `folder` (a `trace` or `StepProfiler` folder), oldest session first."""
  return sorted(pathlib.Path(folder).glob(f"plugins/profile/*/*{suffix}"))


def _events(path: str | pathlib.Path):
  """The events of one .xplane.pb trace (read with JAX's own, private, reader of XSpace protos)."""
  from jax._src.lib import _profile_data

  data = _profile_data.ProfileData.from_file(str(path))
  return [event for plane in data.planes for line in plane.lines for event in line.events]


def event_names(path: str | pathlib.Path) -> set[str]:
  """The names of the events of one .xplane.pb trace."""
  return {event.name for event in _events(path)}


def traced_steps(path: str | pathlib.Path, name: str = STEP_NAME) -> list[int]:
  """The step numbers of the step annotations `name` in one .xplane.pb trace, in order."""
  with warnings.catch_warnings():  # the reader's stats type lacks a __module__ (a DeprecationWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    steps = [dict(event.stats).get("step_num") for event in _events(path) if event.name == name]
  return sorted(int(s) for s in steps if s is not None)
