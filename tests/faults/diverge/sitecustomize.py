"""Imported at start-up by a process with this folder on PYTHONPATH: from step $S3R_TEST_DIVERGE_STEP on,
the optimizer's learning rate is $S3R_TEST_DIVERGE_FACTOR (default 1000) times the scheduled one, as
if the rate had been mistyped there. The training itself is real: the parameters then blow up on any
CPU, where a merely high rate diverges or not depending on the machine's arithmetic. Only the
optimizer's schedule is replaced: the metrics still log the scheduled rate, and the schedule has no
state, so the checkpoints are those of a normal run."""

import os

import jax.numpy as jnp

from s3r.train.step import optimizer

_schedule = optimizer.schedule
STEP = int(os.environ["S3R_TEST_DIVERGE_STEP"])
FACTOR = float(os.environ.get("S3R_TEST_DIVERGE_FACTOR", "1000"))


def _diverging_schedule(cfg):
  rate = _schedule(cfg)
  return lambda count: jnp.where(jnp.asarray(count) + 1 >= STEP, FACTOR, 1.0) * rate(count)


optimizer.schedule = _diverging_schedule
