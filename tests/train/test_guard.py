"""Run safety: divergence detection, the run lock, and the Ctrl-C flag."""

import math
import os
import signal
import subprocess
import sys

import pytest

from s3r.train.config import ConfigError
from s3r.train.guard import DivergenceMonitor, Interrupts, RunLock


def test_a_normal_noisy_descent_is_not_flagged():
  monitor = DivergenceMonitor(6.2)
  losses = [6.2 - 0.01 * i + (0.3 if i % 7 == 0 else 0.0) for i in range(300)]
  assert all(monitor.check(i, loss, 1.0) is None for i, loss in enumerate(losses, start=1))


def test_a_blow_up_far_above_the_running_level_is_flagged_at_its_first_step():
  monitor = DivergenceMonitor(6.27)
  assert monitor.check(1, 6.1, 1.0) is None
  why = monitor.check(2, 3802.0, 50.0)
  assert why.startswith("loss blew up at step 2") and "running level" in why


@pytest.mark.parametrize(
  "loss, grad_norm, what",
  [(math.nan, 1.0, "non-finite loss"), (5.0, math.inf, "non-finite gradient norm"), (6.2383, 0.0, "dead training")],
)
def test_non_finite_values_and_a_zero_gradient_norm_are_flagged(loss, grad_norm, what):
  assert what in DivergenceMonitor(6.2).check(3, loss, grad_norm)


def test_a_second_lock_on_the_same_directory_is_refused_and_released_with_the_first(tmp_path):
  with RunLock(tmp_path):
    with pytest.raises(ConfigError, match=f"another training is running on .*pid {os.getpid()}"):
      RunLock(tmp_path).__enter__()
  with RunLock(tmp_path):  # released: taken again
    pass


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
  code = (
    f"from s3r.train.guard import RunLock; import os; RunLock({str(tmp_path)!r}).__enter__(); os.kill(os.getpid(), 9)"
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
