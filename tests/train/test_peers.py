"""The watch over the other processes of a run (s3r.train.run.peers), in one process: `Peers` objects talk through
an in-memory stand-in of the coordination service's key-value store, and the end of a process (`os._exit`) is
recorded instead. The real runtime, with two processes, is tests/distributed/test_peer_faults.py."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from s3r.train.run import peers

TIMEOUT_S, POLL_S = 0.6, 0.03


class Store:
  """The coordination service's key-value store; `down` makes every call fail as a lost coordinator does."""

  def __init__(self):
    self.values: dict[str, str] = {}
    self.down = False
    self.lock = threading.Lock()

  def client(self) -> Client:
    return Client(self)


class Client:
  def __init__(self, store: Store):
    self.store = store

  def _up(self):
    if self.store.down:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")

  def key_value_set(self, key, value, allow_overwrite=False):
    self._up()
    with self.store.lock:
      self.store.values[key] = value

  def key_value_try_get(self, key):
    self._up()
    with self.store.lock:
      if key not in self.store.values:
        raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
      return self.store.values[key]

  def key_value_dir_get(self, prefix):
    self._up()
    with self.store.lock:
      return [(k, v) for k, v in self.store.values.items() if k.startswith(prefix)]

  def wait_at_barrier(self, name, timeout_ms, process_ids=None):
    self._up()


class Codes(list):
  over: threading.Event


@pytest.fixture
def ends(monkeypatch):
  """The exit codes of the processes that ended: os._exit records them and holds the calling thread until the
  test's Peers are stopped (`job`'s teardown, which runs first)."""
  codes = Codes()
  codes.over = threading.Event()

  def fake_exit(code):
    codes.append(code)
    codes.over.wait()

  monkeypatch.setattr(peers.os, "_exit", fake_exit)
  return codes


@pytest.fixture
def job(tmp_path, ends):
  """make(index, count) -> a started Peers of a run in tmp_path/run (checkpoint 5 complete, 10 cut short);
  lines(peers) -> what it printed on its console. Every thread has ended before os._exit is restored."""
  store, out, made, threads, consoles = Store(), tmp_path / "run", [], [], {}
  (out / "checkpoints" / "5").mkdir(parents=True)
  (out / "checkpoints" / "10.orbax-checkpoint-tmp-1").mkdir()

  def make(index: int, count: int = 2, *, start=True, factor=4.0) -> peers.Peers:
    read, write = os.pipe()
    p = peers.Peers(
      store.client(), index, count, out=out, timeout_s=TIMEOUT_S, factor=factor, console=write, poll_s=POLL_S
    )
    consoles[id(p)] = read
    made.append(p)
    if start:
      for target in (p._talk, p._judge):
        threads.append(threading.Thread(target=target, daemon=True))
        threads[-1].start()
    return p

  def lines(p: peers.Peers) -> list[str]:
    os.set_blocking(consoles[id(p)], False)
    try:
      return os.read(consoles[id(p)], 65536).decode().splitlines()
    except BlockingIOError:
      return []

  yield store, out, make, lines
  for p in made:
    p._stop.set()
  ends.over.set()
  for thread in threads:
    thread.join(5)
    assert not thread.is_alive()


def _until(condition, limit_s: float) -> float:
  """Seconds until `condition()` held; AssertionError past `limit_s`."""
  t0 = time.monotonic()
  while not condition():
    assert time.monotonic() - t0 < limit_s, f"not within {limit_s} s"
    time.sleep(0.01)
  return time.monotonic() - t0


def test_a_silent_peer_is_lost_within_the_timeout_and_named_in_one_line(job, ends):
  store, out, make, lines = job
  survivor, lost = make(0), make(1)
  survivor.begin("step", 7)
  time.sleep(3 * POLL_S)
  lost._stop.set()  # killed: it beats no more
  took = _until(lambda: ends, 4 * TIMEOUT_S)
  assert TIMEOUT_S * 0.8 < took < TIMEOUT_S + 10 * POLL_S
  assert ends == [peers.EXIT_PEER_LOST]
  (line,) = lines(survivor)
  assert line.startswith("s3r: error: lost process 1 of 2 at step 7: no sign of it for")
  assert f"the last checkpoint every process completed is {out / 'checkpoints' / '5'};" in line
  assert line.endswith(f"continue with s3r train --out {out} --resume")
  assert store.values[peers.PREFIX + "abort"] == line.removeprefix("s3r: error: ")  # for the other processes


def test_every_other_process_ends_with_the_line_of_the_one_that_found_the_loss(job, ends):
  store, out, make, lines = job
  first, second = make(1, 3), make(2, 3)
  store.values[peers.PREFIX + "abort"] = "lost process 0 of 3 (the coordinator) at step 4: ..."
  _until(lambda: len(ends) == 2, 1.0)
  assert lines(first) == lines(second) == ["s3r: error: lost process 0 of 3 (the coordinator) at step 4: ..."]


def test_a_coordinator_that_stops_answering_is_lost(job, ends):
  store, out, make, lines = job
  worker = make(1)
  make(0)
  worker.begin("save", 10)
  time.sleep(3 * POLL_S)
  store.down = True
  _until(lambda: ends, 4 * TIMEOUT_S)
  (line,) = lines(worker)
  assert line.startswith("s3r: error: lost process 0 of 2 (the coordinator) while saving checkpoint 10")


def test_a_process_that_finished_is_not_lost(job, ends):
  store, out, make, lines = job
  waiting, done = make(0), make(1)
  done.finished()
  time.sleep(3 * TIMEOUT_S)
  assert ends == [] and lines(waiting) == []


def test_a_step_past_its_deadline_names_the_process_that_is_behind(job, ends):
  """Process 1 beats (alive) but stays at step 2; process 0 waits in step 3 past max(factor x median, 2 x
  timeout)."""
  store, out, make, lines = job
  stuck, waiting = make(1), make(0, factor=4.0)
  stuck.begin("step", 2)
  for step in (1, 2):
    waiting.begin("step", step)
    time.sleep(0.05)
  waiting.begin("step", 3)
  took = _until(lambda: ends, 6 * TIMEOUT_S)
  assert took > 2 * TIMEOUT_S - 0.1
  (line,) = lines(waiting)
  assert line.startswith("s3r: error: process 1 is stuck at step 2 (the others are at step 3): at step 3 ran for")


def test_a_deadline_grows_with_the_median_of_its_phase():
  p = peers.Peers(None, 0, 2, out="run", timeout_s=1.0, factor=10.0, console=2)
  assert p.deadline("step") == 20.0  # no history: factor x the floor of 2 x timeout
  p.durations["step"] = [0.1, 0.1, 5.0]
  assert p.deadline("step") == 2.0  # the floor
  p.durations["step"] = [3.0, 3.0, 4.0]
  assert p.deadline("step") == 30.0
  assert p.deadline("start-up") is None


@pytest.mark.parametrize("seed", range(12))
def test_processes_agree_on_the_stop_step_whoever_gets_the_signal_and_whatever_the_order(job, seed):
  """Lock-step processes (none finishes step s + 1 before all finished step s) each check the store after every
  step in a random order; signals reach random processes at random steps. All stop after the same step, the
  first one after the first signal's step."""
  store, out, make, lines = job
  rng = random.Random(seed)
  group = [make(i, 3, start=False) for i in range(3)]
  signals = {rng.randrange(3): rng.randrange(2, 6) for _ in range(rng.randint(1, 3))}  # process -> step
  stopped: dict[int, tuple[int, str]] = {}
  for step in range(1, 12):
    for p in rng.sample(group, 3):
      if p.index in stopped:
        continue
      requested = "SIGTERM" if signals.get(p.index, 99) <= step else None
      if why := p.stop_at(step, requested):
        stopped[p.index] = (step, why)
  first = min(signals.values())
  assert {step for step, _ in stopped.values()} == {first + 1}, (signals, stopped)
  assert len(stopped) == 3
  signalled = {i for i, at in signals.items() if at <= first + 1}  # those that got their own signal by then
  assert all(why == "SIGTERM" for i, (_, why) in stopped.items() if i in signalled)
  sender = store.values[peers.PREFIX + "stop"].split(":")[2]
  assert all(why == f"SIGTERM to process {sender}" for i, (_, why) in stopped.items() if i not in signalled)


def test_one_process_stops_at_the_step_its_signal_came():
  alone = peers.watch()
  assert alone.stop_at(4, "SIGINT") == "SIGINT" and alone.stop_at(4, None) is None


def test_after_the_runtimes_own_abort_the_line_names_the_task_its_log_names(job, tmp_path):
  store, out, make, lines = job
  p = make(0, 3, start=False)
  p.log_path = tmp_path / "train.log"
  p.log_path.write_text(
    "E1207 coordination_service.cc:1518] Use error polling to propagate the following error to all tasks: "
    "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n2\nThe tasks have crashed.\n"
  )
  p.begin("validate", 20)
  assert p._runtime_lost().startswith("lost process 2 of 3 while validating at step 20: the distributed runtime")
  worker = make(1, 3, start=False)
  assert worker._runtime_lost().startswith("lost process 0 of 3 (the coordinator) at start-up")


def test_an_error_of_one_process_tells_the_others_and_keeps_its_own_one_line_error(job, ends):
  store, out, make, lines = job
  failing = make(1)
  failing.begin("save", 6)
  failing.failed(OSError(28, "No space left on device"))
  assert ends == [] and lines(failing) == []
  told = store.values[peers.PREFIX + "abort"]
  assert told.startswith("process 1 stopped while saving checkpoint 6: OSError: [Errno 28] No space left on device;")
