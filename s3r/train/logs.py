"""Library logs of a run: Orbax, JAX, absl and asyncio log through Python `logging`; during
`train` they go to <out>/train.log (with Python warnings), and reach the console only with
`TrainConfig.verbose` (`s3r train --verbose`). So do the exceptions that library callbacks report
through `sys.unraisablehook` (tensorstore's "Event loop is closed" after a failed read, one
traceback per pending chunk). The run's own messages (`log`, the progress bar, the one-line errors) are
unaffected, so a handled failure prints only its documented line.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys

LOG_FILE = "train.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def library_logs(path: pathlib.Path, *, verbose: bool):
  """Within the block, records of level INFO and above go to `path` (appended); the root logger's own
  handlers (the console) keep theirs only when `verbose`. Restored afterwards."""
  root = logging.getLogger()
  handler = logging.FileHandler(path, encoding="utf-8", delay=True)
  handler.setFormatter(logging.Formatter(FORMAT))
  handler.setLevel(logging.INFO)
  previous_handlers, previous_level = list(root.handlers), root.level
  if not verbose:
    for h in previous_handlers:
      root.removeHandler(h)
  root.addHandler(handler)
  root.setLevel(min(previous_level or logging.WARNING, logging.INFO))
  logging.captureWarnings(True)
  previous_hook = sys.unraisablehook

  def to_log(unraisable):
    error = (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
    logging.getLogger("s3r.train").error("exception ignored in a library callback", exc_info=error)
    if verbose:
      previous_hook(unraisable)

  sys.unraisablehook = to_log
  try:
    yield path
  finally:
    sys.unraisablehook = previous_hook
    logging.captureWarnings(False)
    root.removeHandler(handler)
    handler.close()
    for h in previous_handlers:
      if h not in root.handlers:
        root.addHandler(h)
    root.setLevel(previous_level)
