"""Imported at start-up by a process with this folder on PYTHONPATH: makes the checkpoint save of
step $S3R_TEST_DISK_FULL_STEP fail as a full disk does, after its temporary folder exists.
$S3R_TEST_DISK_FULL_AS: "oserror" (OSError ENOSPC from a file write), "tensorstore" (an array
write's error, which carries the reason in its message only) or "concurrent" (that error, and the
same error of other concurrent writes whose futures nobody awaits, as when every array write of a
save fails: asyncio logs "Future exception was never retrieved" for each when they are collected)."""

import asyncio
import atexit
import errno
import os
import re

from orbax.checkpoint._src.handlers import json_checkpoint_handler

_save = json_checkpoint_handler.JsonCheckpointHandler._save_fn
STEP = os.environ.get("S3R_TEST_DISK_FULL_STEP", "")
_UNAWAITED = []
atexit.register(_UNAWAITED.clear)  # collected when the process ends, after the run's own output


async def _failing_save(self, x, directory):
  if re.search(rf"(^|/){STEP}(\.orbax-checkpoint-tmp[^/]*)?/", str(directory) + "/"):
    how = os.environ.get("S3R_TEST_DISK_FULL_AS")
    if how == "concurrent":  # held until the process ends, as a background thread's failed writes may be
      for i in range(3):
        future = asyncio.get_running_loop().create_future()
        future.set_exception(
          ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{directory}/d/{i + 1}": No space left on device')
        )
        _UNAWAITED.append(future)
    if how in ("tensorstore", "concurrent"):
      raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{directory}/d/0": No space left on device')
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
  return await _save(self, x, directory)


json_checkpoint_handler.JsonCheckpointHandler._save_fn = _failing_save
