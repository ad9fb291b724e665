"""A save that fails while the rest of its writes are in flight leaves nothing behind once it returns."""

import errno
import os

import jax.numpy as jnp
import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from s3r.train.run.checkpoint import CheckpointDiskFull, Checkpointer


@pytest.fixture
def meta_write_fails(monkeypatch):
  """The JSON item's write fails with ENOSPC at once, while the state's array writes are still running."""

  async def full(self, x, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))

  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", full)


def test_a_save_failing_beside_writes_in_flight_leaves_no_folder_once_it_returns(tmp_path, meta_write_fails):
  state = {f"w{i}": jnp.full((512, 512), float(i)) for i in range(16)}  # 16 MiB: its writes outlast the failure
  checkpointer = Checkpointer(tmp_path)
  for attempt in range(3):
    with pytest.raises(CheckpointDiskFull):
      checkpointer.save(2 + attempt, state, {"step": 2 + attempt})
    assert sorted(p.name for p in tmp_path.iterdir()) == [], attempt
  checkpointer.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == []
