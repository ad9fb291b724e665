"""Run safety: divergence detection, the run lock, and the Ctrl-C flag."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from s3r.train.config import ConfigError
from s3r.train.run.guard import DivergenceMonitor, Interrupts, RunLock


def test_a_normal_noisy_descent_is_not_flagged():
  monitor = DivergenceMonitor(6.2)
  losses = [6.2 - 0.01 * i + (0.3 if i % 7 == 0 else 0.0) for i in range(300)]
  assert all(monitor.check(i, loss, 1.0) is None for i, loss in enumerate(losses, start=1))


def test_a_blow_up_far_above_the_running_level_is_flagged_at_its_first_step():
  monitor = DivergenceMonitor(6.27)
  assert monitor.check(1, 6.1, 1.0) is None
  why = monitor.check(2, 3802.0, 50.0)
  assert why is not None and why.startswith("loss blew up at step 2") and "running level" in why


REPO = pathlib.Path(__file__).resolve().parents[2]


def _committed_curves() -> list[list[float]]:
  """The training-loss curves of the committed sweep summaries (healthy runs, every 5th step)."""
  curves = []
  for path in sorted((REPO / "research" / "results").glob("*/runs/*.json")):
    summary = json.loads(path.read_text())
    if summary.get("status") == "done" and summary.get("curve"):
      curves.append([loss for _, loss in summary["curve"]])
  return curves


def test_the_reported_blow_up_from_6_26_to_15_06_is_flagged_at_once():
  monitor = DivergenceMonitor(6.27)
  for step, loss in enumerate([6.25, 6.22, 6.24, 6.26], start=1):
    assert monitor.check(step, loss, 1.5) is None
  why = monitor.check(5, 15.06, 40.0)
  assert why is not None and why.startswith("loss blew up at step 5")


def test_a_fast_rise_over_consecutive_steps_is_flagged_before_it_doubles():
  monitor = DivergenceMonitor(6.2)
  assert [monitor.check(s, loss, 1.0) for s, loss in enumerate([6.1, 6.9, 7.6], start=1)] == [None] * 3
  why = monitor.check(4, 8.4, 3.0)
  assert why is not None and why.startswith("loss rose fast at step 4")


def test_a_loss_that_stays_above_the_initial_one_is_flagged_on_its_second_step():
  """A slow blow-up measured on the tiny preset at lr 1.0: the running level follows it up, so it never
  doubles, but from step 4 on the model is worse than the one training started from."""
  monitor = DivergenceMonitor(5.685)
  assert [monitor.check(s, loss, 1.0) for s, loss in enumerate([5.685, 5.562, 3.694, 10.225], start=1)] == [None] * 4
  why = monitor.check(5, 7.919, 1.0)
  assert why is not None and why.startswith("loss stayed above the initial loss 5.685 at step 5")


def test_one_step_above_the_initial_loss_is_not_flagged():
  monitor = DivergenceMonitor(5.7)
  losses = [5.6, 6.9, 5.5, 6.8, 5.4]  # single steps more than 1 nat above, never two in a row
  assert [monitor.check(s, loss, 1.0) for s, loss in enumerate(losses, start=1)] == [None] * len(losses)


def test_committed_healthy_curves_are_never_flagged():
  curves = _committed_curves()
  assert len(curves) >= 20  # the sweeps' summaries are there to check against
  for curve in curves:
    monitor = DivergenceMonitor(curve[0])
    assert [why for step, loss in enumerate(curve[1:], start=1) if (why := monitor.check(step, loss, 1.0))] == []


def test_the_noise_of_a_low_overfitting_loss_is_not_flagged():
  """A 60-document corpus trained for hundreds of steps: the loss hovers near 0.75 with jumps to 1.2."""
  monitor = DivergenceMonitor.following([5.7] + [0.75] * 200)
  losses = [0.7, 0.9, 1.05, 1.21, 0.8, 0.74, 1.2, 0.76, 0.71]
  assert all(monitor.check(s, loss, 1.0) is None for s, loss in enumerate(losses, start=201))


def test_a_resumed_monitor_follows_the_run_so_far_not_only_the_initial_loss():
  monitor = DivergenceMonitor.following([6.2] + [3.0] * 100)
  assert monitor.level == pytest.approx(3.0, abs=1e-3)
  assert monitor.check(101, 7.0, 1.0) is not None  # 2.3x the level, though below 2x the initial loss


@pytest.mark.parametrize(
  "loss, grad_norm, what",
  [(math.nan, 1.0, "non-finite loss"), (5.0, math.inf, "non-finite gradient norm"), (6.2383, 0.0, "dead training")],
)
def test_non_finite_values_and_a_zero_gradient_norm_are_flagged(loss, grad_norm, what):
  why = DivergenceMonitor(6.2).check(3, loss, grad_norm)
  assert why is not None and what in why


def test_a_second_lock_on_the_same_directory_is_refused_and_released_with_the_first(tmp_path):
  with RunLock(tmp_path):
    with pytest.raises(ConfigError, match=f"another training is running on .*pid {os.getpid()}"):
      RunLock(tmp_path).__enter__()
  with RunLock(tmp_path):  # released: taken again
    pass


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
  code = (
    "from s3r.train.run.guard import RunLock; import os; "
    f"RunLock({str(tmp_path)!r}).__enter__(); os.kill(os.getpid(), 9)"
  )
  proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == -signal.SIGKILL and (tmp_path / ".lock").exists()
  with RunLock(tmp_path):
    pass


def test_sigint_sets_the_flag_instead_of_raising_and_a_second_one_raises():
  before = signal.getsignal(signal.SIGINT)  # the default handler, or SIG_IGN under a background job
  with Interrupts() as interrupts:
    os.kill(os.getpid(), signal.SIGINT)
    assert interrupts.requested == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is before  # restored


def test_signals_inside_a_deferred_block_wait_for_it_to_end():
  with Interrupts() as interrupts:
    with interrupts.deferred():
      os.kill(os.getpid(), signal.SIGINT)
      os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while a checkpoint is written: no exception
      os.kill(os.getpid(), signal.SIGTERM)
    assert interrupts.requested == "SIGINT" and interrupts.deferred_count == 1
    with pytest.raises(KeyboardInterrupt):  # outside the block a second Ctrl-C interrupts again
      os.kill(os.getpid(), signal.SIGINT)
