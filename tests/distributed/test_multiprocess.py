"""Two processes on 127.0.0.1 (4 simulated CPU devices each, gloo collectives) train `tiny`
through `s3r train --coordinator ... --num-processes 2 --process-id I` on one global 4x2 mesh;
each process loads only its half of every global batch. The losses match the single-process
8-device run of the same command (test_checkpoint_reshard.py's fixture)."""

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.distributed.conftest import REPO, device_env
from tests.distributed.workers import cli_flags

TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _two_processes(sharded_cli_run, out, *extra: str) -> list[str]:
  """Runs `s3r train` as processes 0 and 1 of one job on a 4x2 mesh; their logs (each must exit 0)."""
  port, procs = _free_port(), []
  for i in range(2):
    argv = cli_flags(
      str(sharded_cli_run["corpus"]),
      str(sharded_cli_run["cache"]),
      str(out),
      "--mesh",
      "fsdp=4,tensor=2",
      "--coordinator",
      f"127.0.0.1:{port}",
      "--num-processes",
      "2",
      "--process-id",
      str(i),
      *extra,
    )
    procs.append(
      subprocess.Popen(
        [sys.executable, "-m", "s3r.cli", *argv],
        env=device_env(4),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=TIMEOUT_S)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"process {i}:\n{log[-3000:]}"
  return logs


@pytest.mark.slow
def test_two_processes_train_to_the_losses_of_one_process(sharded_cli_run, tmp_path):
  out = tmp_path / "run"
  logs = _two_processes(sharded_cli_run, out)
  assert "final validation loss" in logs[0] and "final validation loss" not in logs[1]  # process 0 reports

  ours = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  ref = sharded_cli_run["result"]["4x2"]
  assert [r["step"] for r in ours] == [0, 1, 2, 3, 4]
  assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
  # The same SPMD program on the same mesh, but gloo adds the f32 cross-device sums (the token-mean loss,
  # the global gradient norm that clipping divides by) in another order than XLA's in-process
  # all-reduce. Steps 0 and 1 see the initial parameters: equal up to that last bit. After the first
  # update the parameters may differ in their last bits, which a flipped stochastic-rounding decision
  # can grow; a wrong batch or key on one process moves the loss far more than that.
  for key in ("loss", "grad_norm"):
    mine, theirs = [r[key] for r in ours if key in r], [r[key] for r in ref if key in r]
    np.testing.assert_allclose(mine[:2], theirs[:2], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(mine, theirs, rtol=1e-3, err_msg=key)
  np.testing.assert_allclose(ours[-1]["val_loss"], ref[-1]["val_loss"], rtol=1e-3)


@pytest.mark.slow
def test_two_processes_resume_together_with_the_same_loss_history(sharded_cli_run, tmp_path):
  """On resume only process 0 reads the metrics; it sends the loss history to process 1, so both
  processes' divergence guards start alike and the job finishes (a disagreement would hang it)."""
  out = tmp_path / "run"
  _two_processes(sharded_cli_run, out)
  logs = _two_processes(sharded_cli_run, out, "--steps", "6", "--resume")
  assert "resume: restored step 4" in logs[0] and "final validation loss" in logs[0]
  ours = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in ours] == list(range(7))
