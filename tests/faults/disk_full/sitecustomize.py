"""Imported at start-up by a process with this folder on PYTHONPATH: makes the checkpoint save of
step $S3R_TEST_DISK_FULL_STEP fail as a full disk does, after its temporary folder exists.
$S3R_TEST_DISK_FULL_AS: "oserror" (OSError ENOSPC from a file write) or "tensorstore" (an array
write's error, which carries the reason in its message only)."""

import errno
import os
import re

from orbax.checkpoint._src.handlers import json_checkpoint_handler

_save = json_checkpoint_handler.JsonCheckpointHandler._save_fn
STEP = os.environ.get("S3R_TEST_DISK_FULL_STEP", "")


async def _failing_save(self, x, directory):
  if re.search(rf"(^|/){STEP}(\.orbax-checkpoint-tmp[^/]*)?/", str(directory) + "/"):
    if os.environ.get("S3R_TEST_DISK_FULL_AS") == "tensorstore":
      raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{directory}/d/0": No space left on device')
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
  return await _save(self, x, directory)


json_checkpoint_handler.JsonCheckpointHandler._save_fn = _failing_save
