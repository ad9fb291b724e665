"""Several processes, one run: a lost, stuck or preempted process never hangs the others.

`s3r train --coordinator ...` (or `--distributed`) starts `Peers` with `jax.distributed` (`start`):

* **Liveness.** A thread of every process publishes a beat (a counter, its step and phase) to the
  coordination service's key-value store every `poll_s` and reads everyone's. A process whose beat has not
  changed for `timeout_s` (`--peer-timeout`) is lost (killed, stopped, its host gone); so is the
  coordinator (process 0, which holds the store) when the store has not answered for that long. A thread of
  its own judges, from what the talking thread saw and when, so that a call that never returns cannot stop it.
* **Stalls.** In the step loop (`begin`), a step, validation or save that runs longer than
  max(`factor` x the median of that phase so far, `timeout_s`) (without history: `factor` x `timeout_s`)
  means a collective that does not complete; the process that is behind by its published step is named.
* **The end.** The process that finds either prints one line to the console (the original stderr) naming
  the lost or stuck process, the step, the newest checkpoint every process completed (Orbax renames a
  checkpoint's folder into place only after a barrier of all processes: a folder is complete) and the
  command to resume; it puts the line into the store, so that the other processes end with the same line,
  and leaves with EXIT_PEER_LOST at once (`os._exit`: its main thread may wait in a collective forever).
  A process that fails for another reason says so in the store before it ends.
* **Preemption of some processes.** SIGTERM/SIGINT to any process: `stop_at` agrees on the step at
  which all of them save and stop. The signalled process writes "stop after step s + 1" when it has
  finished step s; every process reads the store after each step, and none can finish step s + 1 before
  the writer has started it, so all of them read it there.
* **Runtime messages.** XLA and gRPC write to fd 2 directly, gloo to fd 1; without --verbose both go to the
  process's log file (train.log, train.log.<i>), and Python's `sys.stdout` and `sys.stderr` to the console.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pathlib
import re
import statistics
import sys
import threading
import time

EXIT_PEER_LOST = 75
PREFIX = "s3r/"
PHASES = ("step", "validate", "save")  # the phases with a stall deadline
_ACTIVE: Peers | None = None


def active() -> Peers | None:
  """The Peers of this process, or None (one process)."""
  return _ACTIVE


class _Alone:
  """What the step loop calls on one process: no watch, a signal stops at once."""

  def begin(self, phase: str, step: int | None) -> None:
    pass

  def stop_at(self, step: int, requested: str | None) -> str | None:
    return requested

  def gather(self, name: str) -> None:
    pass


def watch() -> Peers | _Alone:
  """The hooks of the step loop: this process's Peers, or nothing to watch on one process."""
  return _ACTIVE or _Alone()


def start(*, coordinator, num_processes, process_id, out: str, timeout_s: float, factor: float, verbose: bool) -> Peers:
  """jax.distributed.initialize (from the arguments, or detected from the cluster when `coordinator` is
  None) with the runtime's own heartbeat as a later backstop, fd 2 sent to the run's log, and the watch."""
  import jax

  console, log_path = sys.stderr.fileno(), None

  def log_of(index: int) -> pathlib.Path:
    return pathlib.Path(out) / ("train.log" if index == 0 else f"train.log.{index}")

  if not verbose and process_id is not None:
    log_path = log_of(process_id)
    console = _send_fd2_to(log_path)
  _on_runtime_abort.install()
  backstop = int(2 * timeout_s + 10)  # the runtime aborts a process whose peer it lost: after us
  kwargs = dict(heartbeat_timeout_seconds=backstop, shutdown_timeout_seconds=max(10, int(timeout_s)))
  if coordinator:
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id, **kwargs)
  else:
    jax.distributed.initialize(**kwargs)
  if not verbose and log_path is None:  # the index came from the cluster's environment
    log_path = log_of(jax.process_index())
    console = _send_fd2_to(log_path)
  from jax._src import distributed

  peers = Peers(
    distributed.global_state.client,
    jax.process_index(),
    jax.process_count(),
    out=out,
    timeout_s=timeout_s,
    factor=factor,
    console=console,
    log_path=log_path,
  )
  peers.start()
  return peers


def _send_fd2_to(log_path: pathlib.Path) -> int:
  """Points fds 1 and 2 at `log_path` (appended; gloo prints to fd 1, XLA and gRPC to fd 2) and `sys.stdout`
  and `sys.stderr` at copies of the old ones; returns the copy of fd 2."""
  log_path.parent.mkdir(parents=True, exist_ok=True)
  copies = []
  for fd, name in ((1, "stdout"), (2, "stderr")):
    getattr(sys, name).flush()
    copies.append(os.dup(fd))
    sink = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(sink, fd)
    os.close(sink)
    stream = open(copies[-1], "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    setattr(sys, name, stream)
  return copies[1]


class Peers:
  """The watch of one process over the others (see the module)."""

  def __init__(self, client, index: int, count: int, *, out, timeout_s, factor, console, log_path=None, poll_s=None):
    self.client, self.index, self.count = client, index, count
    self.out, self.timeout_s, self.factor = str(out), float(timeout_s), float(factor)
    self.console, self.log_path = console, log_path
    self.poll_s = poll_s or min(1.0, self.timeout_s / 8)
    self.step: int | None = None  # the step of the current phase (None at start-up)
    self.phase, self.since = "start-up", time.monotonic()
    self.durations: dict[str, list[float]] = {p: [] for p in PHASES}
    self._beat = 0
    self._seen: dict[int, tuple[str, float]] = {}  # process -> (its beat, when it last changed)
    self._done: set[int] = set()
    self._abort: str | None = None
    self._answered = time.monotonic()  # when the store last answered
    self._stop = threading.Event()
    self._exiting = threading.Lock()
    self.ended: int | None = None  # the exit code of a planned end (`finished`)

  def start(self) -> None:
    global _ACTIVE
    _ACTIVE = self
    for target, name in ((self._talk, "s3r-peers-talk"), (self._judge, "s3r-peers-judge")):
      threading.Thread(target=target, name=name, daemon=True).start()

  # -- the main thread's side --------------------------------------------------------------------------
  def begin(self, phase: str, step: int | None) -> None:
    """The main thread enters `phase` (step, validate, save, end) of `step`; the previous one's duration counts."""
    now = time.monotonic()
    if self.phase in self.durations:
      self.durations[self.phase].append(now - self.since)
    self.phase, self.step, self.since = phase, step, now

  def deadline(self, phase: str) -> float | None:
    if phase not in self.durations:
      return None
    past = self.durations[phase]
    floor = 2 * self.timeout_s  # past the time in which the judge finds a lost process
    return max(self.factor * statistics.median(past), floor) if past else self.factor * floor

  def gather(self, name: str) -> None:
    """Waits until every process got here (a barrier of the coordination service, not a collective): gloo
    gives the peers of a program's first collective 30 s to join it, less than the time one process may
    compile longer than another. A lost process ends the wait through the judge."""
    self.client.wait_at_barrier(PREFIX + name, 24 * 3600 * 1000)

  def stop_at(self, step: int, requested: str | None) -> str | None:
    """Why every process stops after `step` (a signal, and to which process), or None; `requested`: this
    process's own signal, if it got one."""
    value = self._get(PREFIX + "stop")
    if value is None and requested:
      value = f"{step + 1}:{requested}:{self.index}"
      self.client.key_value_set(PREFIX + "stop", value, allow_overwrite=True)
    if value is None:
      return None
    at, signal, who = value.split(":")
    if int(at) > step:
      return None
    return requested or (signal if int(who) == self.index else f"{signal} to process {who}")

  def finished(self, code: int = 0) -> None:
    """This process ends as planned with exit code `code` (done, or stopped together): the others no longer
    watch it, and the runtime's abort after this (a peer that left first) ends it with that code."""
    self.ended = code
    self._set(f"{PREFIX}done/{self.index}", "1")
    self._stop.set()

  def failed(self, error: BaseException) -> None:
    """The main thread stopped with `error`. A runtime error (a collective whose peer is gone) first gives the
    judge the time to name a lost process; then, and for any other error, this process ends with one line
    that the others end with too."""
    _log_exception(self.log_path, error)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    why = f"{type(error).__name__}: {first}"[:200]
    if _runtime_error(error):
      time.sleep(self.timeout_s + 4 * self.poll_s)  # the judge ends the process within this if a peer is lost
      self._end(f"a collective failed on process {self.index} {self._where()} ({why}); {self._resume()}")
    self._stop.set()  # this process ends with its own error, not with another's
    if isinstance(error, Exception):  # s3r's own one-line errors end this process as usual; the others learn it
      self._set(PREFIX + "abort", f"process {self.index} stopped {self._where()}: {why}; {self._resume()}")

  # -- the threads -------------------------------------------------------------------------------------
  def _talk(self) -> None:
    while not self._stop.is_set():
      self._beat += 1
      try:
        self.client.key_value_set(
          f"{PREFIX}beat/{self.index}", f"{self._beat}:{self.step}:{self.phase}", allow_overwrite=True
        )
        entries = self.client.key_value_dir_get(PREFIX)
      except Exception:  # the store is gone or not answering: the judge counts the time since it last did
        time.sleep(self.poll_s)
        continue
      now = time.monotonic()
      self._answered = now
      for key, value in entries:
        name = key.removeprefix(PREFIX).strip("/")
        if name == "abort":
          self._abort = value
        elif name.startswith("done/"):
          self._done.add(int(name.split("/")[1]))
        elif name.startswith("beat/"):
          process = int(name.split("/")[1])
          if self._seen.get(process, ("", 0.0))[0] != value:
            self._seen[process] = (value, now)
      time.sleep(self.poll_s)

  def _judge(self) -> None:
    started = last = time.monotonic()
    while not self._stop.wait(self.poll_s):
      if self._abort:
        self._end(self._abort, publish=False)
      now = time.monotonic()
      if now - last > self.timeout_s:  # this process did not run (stopped, or starved): the others went on
        self._end(f"process {self.index} was frozen for {now - last:.0f} s {self._where()}; {self._resume()}")
      last = now
      if self.index != 0 and now - self._answered > self.timeout_s:
        self._end(self._lost(0, now - self._answered))
      for process in range(self.count):
        if process == self.index or process in self._done:
          continue
        silent = now - self._seen.get(process, ("", started))[1]
        if silent > self.timeout_s and now - self._answered <= self.timeout_s:
          self._end(self._lost(process, silent))
      deadline = self.deadline(self.phase)
      if deadline is not None and now - self.since > deadline:
        self._end(self._stalled(now - self.since, deadline))

  # -- the one line ------------------------------------------------------------------------------------
  def _where(self) -> str:
    if self.step is None:
      return "at start-up"
    return {"save": f"while saving checkpoint {self.step}", "validate": f"while validating at step {self.step}"}.get(
      self.phase, f"at step {self.step}"
    )

  def _lost(self, process: int, silent: float | None) -> str:
    who = f"process {process} of {self.count}" + (" (the coordinator)" if process == 0 else "")
    why = f"no sign of it for {silent:.0f} s" if silent is not None else "the distributed runtime lost it"
    return f"lost {who} {self._where()}: {why}; {self._resume()}"

  def _runtime_lost(self) -> str:
    """The line after the runtime's own abort, naming the process its last message (in the log) names."""
    tail = ""
    if self.log_path is not None:
      with contextlib.suppress(OSError), open(self.log_path, "rb") as log:
        log.seek(max(0, log.seek(0, 2) - 16384))
        tail = log.read().decode(errors="replace")
    unhealthy = re.findall(r"tasks are unhealthy \(stopped sending heartbeats\):\s*(\d+)", tail)
    if unhealthy:
      return self._lost(int(unhealthy[-1]), None)
    if self.index != 0 and (not tail or "coordination service" in tail):
      return self._lost(0, None)
    return f"process {self.index} aborted {self._where()} (its log: {self.log_path}); {self._resume()}"

  def _stalled(self, took: float, deadline: float) -> str:
    beats = {p: v.split(":") for p, (v, _) in self._seen.items()}
    steps = {p: int(s) for p, (_, s, _) in beats.items() if s.lstrip("-").isdigit()}
    if self.step is not None:
      steps[self.index] = self.step
    behind = sorted(p for p, s in steps.items() if s == min(steps.values())) if steps else []
    who = (
      f"process {behind[0]} is stuck at step {steps[behind[0]]} (the others are at step {max(steps.values())})"
      if len(behind) == 1 and len(set(steps.values())) > 1
      else "a collective did not complete"
    )
    return f"{who}: {self._where()} ran for {took:.0f} s, past its deadline of {deadline:.0f} s; {self._resume()}"

  def _resume(self) -> str:
    ckpt = last_complete_checkpoint(self.out)
    saved = f"the last checkpoint every process completed is {ckpt}" if ckpt else "no checkpoint was completed"
    return f"{saved}; continue with s3r train --out {self.out} --resume"

  def _end(self, message: str, publish: bool = True) -> None:
    """Prints `message` as the one console line, logs it with every thread's stack, tells the others
    (`publish`) and ends the process."""
    if not self._exiting.acquire(blocking=False):
      return
    line = f"s3r: error: {message}\n"
    with contextlib.suppress(OSError):
      os.write(self.console, line.encode())
    if self.log_path is not None:
      with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as log:
        log.write(f"peers: {line}")
        log.flush()
        faulthandler.dump_traceback(log, all_threads=True)
    if publish:  # the others read it within a poll (process 0 holds the store: it waits for that)
      telling = threading.Thread(target=self._set, args=(PREFIX + "abort", message), daemon=True)
      telling.start()
      telling.join(min(2.0, self.timeout_s))
      time.sleep(min(3 * self.poll_s, 3.0))
    os._exit(EXIT_PEER_LOST)

  def _get(self, key: str) -> str | None:
    try:
      return self.client.key_value_try_get(key)
    except Exception as e:  # NOT_FOUND; a store that is gone leaves the decision to the judge
      if "NOT_FOUND" not in str(e):
        time.sleep(self.timeout_s + 4 * self.poll_s)
      return None

  def _set(self, key: str, value: str) -> None:
    with contextlib.suppress(Exception):
      self.client.key_value_set(key, value, allow_overwrite=True)


class _RuntimeAbort:
  """A SIGABRT handler for the distributed runtime's own ending: its client aborts the process when it
  loses the coordinator (at once, when process 0 dies) or hears from the coordination service that a
  task failed. The handler (ctypes: it runs in the aborting runtime thread, where a Python-level signal
  handler would never run) ends the process as the judge does, naming the process the runtime's last
  message (in the log) names; after a planned end (`Peers.finished`) quietly with that end's code."""

  def __init__(self):
    self._handler = None

  def install(self) -> None:
    import ctypes

    kind = ctypes.CFUNCTYPE(None, ctypes.c_int)
    self._handler = kind(self)  # kept referenced: libc holds only the pointer
    libc = ctypes.CDLL(None)
    libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, [ctypes.c_int, kind]
    libc.signal(6, self._handler)  # SIGABRT

  def __call__(self, signum: int) -> None:
    peers = _ACTIVE
    if peers is None:
      os._exit(EXIT_PEER_LOST)
    if peers.ended is not None:
      os._exit(peers.ended)
    peers._end(peers._runtime_lost(), publish=False)
    time.sleep(10)  # another thread is ending the process
    os._exit(EXIT_PEER_LOST)


_on_runtime_abort = _RuntimeAbort()


def last_complete_checkpoint(out: str | pathlib.Path) -> pathlib.Path | None:
  """The newest checkpoint folder of run `out` that Orbax finalized (renamed into place after every process
  wrote its part; a save cut short leaves only a temporary folder)."""
  directory = pathlib.Path(out).absolute() / "checkpoints"
  with contextlib.suppress(OSError):
    steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir()]
    return directory / str(max(steps)) if steps else None
  return None


def _runtime_error(error: BaseException) -> bool:
  """An error of the JAX runtime (a failed collective, a store that is gone), not one of s3r's own."""
  return type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError") or any(
    word in str(error) for word in ("Gloo", "UNAVAILABLE", "DEADLINE_EXCEEDED")
  )


def _log_exception(path: pathlib.Path | None, error: BaseException) -> None:
  import traceback

  if path is not None:
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as log:
      log.write("peers: the main thread stopped with:\n" + "".join(traceback.format_exception(error)))
