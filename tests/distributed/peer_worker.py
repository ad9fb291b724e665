"""A stand-in for a training process of a multi-process run, without a model: `s3r.train.run.peers` started as
`s3r train` starts it, then a loop of one small collective per step with the step loop's hooks.

  python tests/distributed/peer_worker.py OUT PORT PROCESS_ID [PEER_TIMEOUT_S [HANG_AT_STEP]]

Writes OUT/step.<process> after each step; on an agreed stop it prints "stopped after step S: WHY" and exits
130, as `s3r train` does after its save. With HANG_AT_STEP, process 1's main thread blocks for good after
that step (its other threads run on: a live process whose collective never comes)."""

import pathlib
import sys
import threading
import time

import numpy as np


def main(out: str, port: str, process_id: str, timeout_s: str = "4", hang_at_step: str = "0") -> int:
  from s3r.train.run import peers
  from s3r.train.run.guard import Interrupts

  watch = peers.start(
    coordinator=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=int(process_id),
    out=out,
    timeout_s=float(timeout_s),
    factor=10.0,
    verbose=False,
  )
  from jax.experimental import multihost_utils

  try:  # as `s3r train` (s3r.cli.train.run_train) wraps the training
    watch.gather("compiled")
    with Interrupts() as interrupts:
      for step in range(1, 100_000):
        watch.begin("step", step)
        multihost_utils.process_allgather(np.int32(step))
        (pathlib.Path(out) / f"step.{process_id}").write_text(str(step))
        if why := watch.stop_at(step, interrupts.requested):
          print(f"stopped after step {step}: {why}", flush=True)
          watch.finished(130)
          return 130
        watch.begin("end", step)
        if step == int(hang_at_step) and process_id == "1":
          threading.Event().wait()
        time.sleep(0.02)
  except BaseException as e:
    watch.failed(e)
    raise
  return 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:]))
