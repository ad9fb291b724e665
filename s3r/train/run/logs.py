"""Library logs of a run: Orbax, JAX, absl and asyncio log through Python `logging`; during
`train` they go to <out>/train.log (with Python warnings), and reach the console only with
`TrainConfig.verbose` (`s3r train --verbose`). So do the exceptions that library callbacks report
through `sys.unraisablehook` (tensorstore's "Event loop is closed" after a failed read, one
traceback per pending chunk), and asyncio's "exception was never retrieved" of a failed write's
futures that are collected after the run (`_LateAsyncioToFile`). The run's own messages (`log`, the
progress bar, the one-line errors) are unaffected, so a handled failure prints only its documented line.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import pathlib
import sys
import traceback

LOG_FILE = "train.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# s3r's own details for <out>/train.log (a skipped checkpoint's traceback, ...): written there during
# `library_logs`, silent everywhere else (it does not propagate to the console handlers of the root).
RUN_LOG = logging.getLogger("s3r.run")
RUN_LOG.propagate = False
RUN_LOG.addHandler(logging.NullHandler())


@contextlib.contextmanager
def library_logs(path: pathlib.Path, *, verbose: bool):
  """Within the block, records of level WARNING and above go to `path` (appended); the root logger's own
  handlers (the console) keep theirs only when `verbose`. Restored afterwards, but for the unraisable-
  exception hook (see `_UnraisableToFile`)."""
  root = logging.getLogger()
  handler = logging.FileHandler(path, encoding="utf-8", delay=True)
  handler.setFormatter(logging.Formatter(FORMAT))
  handler.setLevel(logging.WARNING)
  previous_handlers, previous_level = list(root.handlers), root.level
  if not verbose:
    for h in previous_handlers:
      root.removeHandler(h)
  root.addHandler(handler)
  RUN_LOG.addHandler(handler)
  root.setLevel(min(previous_level or logging.WARNING, logging.INFO))
  logging.captureWarnings(True)
  sys.unraisablehook = _UnraisableToFile(path, sys.unraisablehook if verbose else None)
  _LATE_ASYNCIO.path = None if verbose else path
  try:
    yield path
  finally:
    gc.collect()  # futures of failed library writes report "never retrieved" now, into the file
    logging.captureWarnings(False)
    root.removeHandler(handler)
    RUN_LOG.removeHandler(handler)
    handler.close()
    for h in previous_handlers:
      if h not in root.handlers:
        root.addHandler(h)
    root.setLevel(previous_level)


class _UnraisableToFile:
  """sys.unraisablehook that appends the exception to a log file (and passes it on to `then`). It stays
  installed after the run: library threads of the run (tensorstore callbacks) may still report then."""

  def __init__(self, path: pathlib.Path, then):
    self.path, self.then = path, then

  def __call__(self, unraisable):
    lines = traceback.format_exception(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
    try:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(f"exception ignored in a library callback ({unraisable.err_msg or 'no message'}):\n{''.join(lines)}")
    except OSError:
      pass
    if self.then is not None:
      self.then(unraisable)


class _LateAsyncioToFile(logging.Filter):
  """A filter on the "asyncio" logger that sends its "exception was never retrieved" records to the log
  file of the latest non-verbose run instead of the console. Such a record comes when the futures of a
  library's failed writes (Orbax on a full disk) are collected, which may be after the run; every
  other asyncio record passes as usual."""

  def __init__(self):
    super().__init__()
    self.path: pathlib.Path | None = None

  def filter(self, record: logging.LogRecord) -> bool:
    if self.path is None or "never retrieved" not in str(record.msg):
      return True
    try:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(logging.Formatter(FORMAT).format(record) + "\n")
    except OSError:
      pass
    return False


_LATE_ASYNCIO = _LateAsyncioToFile()
logging.getLogger("asyncio").addFilter(_LATE_ASYNCIO)
