"""What every `s3r` sub-command shares: the parser that reports a bad flag in one line, the help
formatter, the exit codes (EXIT_CODES, documented in s3r.cli) and `guarded`, which turns expected
failures into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from s3r.quant import Recipe


class Parser(argparse.ArgumentParser):
  """Reports a bad flag in one line (exit code 2)."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Shows "(default: X)" except where the default is None or False (the help text says it); keeps the
  paragraphs of the epilog (see `paragraphs`)."""

  def _get_help_string(self, action):
    return action.help if action.default is None or action.default is False else super()._get_help_string(action)


EXIT_CODES = {
  "ok": 0,
  "diverged": 1,
  "bad_input": 2,
  "resources": 3,
  "interrupted": 130,
  "peer_lost": 75,
  "internal": 70,
}
EXIT_HELP = (
  "exit codes: 0 ok, 1 training diverged, 2 bad input (flags, data, run directory), 3 not enough "
  "memory or disk, 130 interrupted (a checkpoint is saved first), 75 a process of a multi-process run was lost "
  "or stuck, 70 internal error"
)


def paragraphs(*texts: str) -> str:
  import textwrap

  return "\n\n".join(textwrap.fill(t, 100) for t in texts)


def fail(message: str, code: int = 2) -> int:
  print(f"s3r: error: {message}", file=sys.stderr)
  return code


def guarded(run, args) -> int:
  """Runs a command, turning expected failures into one line and an exit code (EXIT_CODES)."""
  from s3r.data import DataError
  from s3r.model.hf.errors import HFError
  from s3r.train.builder import ResourceError
  from s3r.train.config import ConfigError
  from s3r.train.run.guard import TrainingDiverged, TrainingInterrupted

  try:
    return run(args) or 0
  except (DataError, ConfigError, HFError) as e:
    return fail(str(e), EXIT_CODES["bad_input"])
  except TrainingDiverged as e:
    return fail(str(e), EXIT_CODES["diverged"])
  except ResourceError as e:
    return fail(str(e), EXIT_CODES["resources"])
  except TrainingInterrupted as e:
    return fail(f"interrupted: {e}", EXIT_CODES["interrupted"])
  except KeyboardInterrupt:
    return fail("interrupted before training started; nothing was saved", EXIT_CODES["interrupted"])
  except MemoryError:
    return fail("out of host memory; lower --batch or --seq, or use a smaller corpus", EXIT_CODES["resources"])
  except OSError as e:
    import errno

    code = EXIT_CODES["resources"] if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM) else EXIT_CODES["bad_input"]
    return fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e), code)
  except Exception as e:
    if "RESOURCE_EXHAUSTED" in str(e):
      first = next((line for line in str(e).splitlines() if "RESOURCE_EXHAUSTED" in line), str(e))[:300]
      return fail(
        f"out of device memory ({first.strip()}); lower --batch or --seq, or add devices (--mesh)",
        EXIT_CODES["resources"],
      )
    import traceback

    traceback.print_exc()
    return fail(f"internal error: {type(e).__name__}: {e}", EXIT_CODES["internal"])


def recipe_name(value: str) -> Recipe:
  """`--recipe`: the Recipe that a registered recipe name, NAME@FORMAT or NAME[@FORMAT]+fwd_FORMAT names (parsed here,
  once, by s3r.quant.recipe), refused in one line."""
  from s3r.quant import recipe

  try:
    return recipe(value)
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r}: {e}") from None
