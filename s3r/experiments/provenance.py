"""Provenance of a results file: command, git revision, JAX version, machine, date.

A small local writer so that the experiment modules do not depend on the benchmark package.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any


def _git(*args: str) -> str | None:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=20).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None


def portable(arg: str) -> str:
  """`arg` without machine-specific prefixes: an absolute path becomes relative to the working
  directory when under it, else is cut to its part from `runs/` (or to its last two parts)."""
  if not os.path.isabs(arg):
    return arg
  path = pathlib.Path(arg)
  try:
    return str(path.relative_to(pathlib.Path.cwd()))
  except ValueError:
    parts = path.parts
    return "/".join(parts[parts.index("runs"):]) if "runs" in parts else "/".join(parts[-2:])


def command_line(argv: list[str] | None = None) -> str:
  """The command as run from the repository root (module form, no absolute paths)."""
  argv = [portable(a) for a in (sys.argv[1:] if argv is None else argv)]
  module = getattr(sys.modules.get("__main__"), "__spec__", None)
  head = f"python -m {module.name}" if module is not None else pathlib.Path(sys.argv[0]).name
  return " ".join([head, *argv])


def run_meta(argv: list[str] | None = None) -> dict[str, Any]:
  """Command, git HEAD (and whether tracked files differ), JAX, Python, backend, CPU, date."""
  import jax

  status = _git("status", "--porcelain", "--untracked-files=no")
  return {
      "command": command_line(argv),
      "git": {"rev": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None},
      "jax": jax.__version__,
      "python": platform.python_version(),
      "backend": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "machine": f"{platform.machine()}, {os.cpu_count()} cores",
      "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
  }


def meta_markdown(meta: dict[str, Any]) -> str:
  g = meta.get("git") or {}
  dirty = " (uncommitted changes)" if g.get("dirty") else ""
  return (f"- command: `{meta['command']}`\n- git: `{g.get('rev')}`{dirty}\n- jax {meta['jax']}, python "
          f"{meta['python']}, backend {meta['backend']} ({meta['device_kind']}), {meta['machine']}\n"
          f"- date (UTC): {meta['date_utc']}\n")


def write_json(path: pathlib.Path, data: Any) -> None:
  """Atomic write (a reader never sees half a file, a run killed mid-write keeps the last one)."""
  path = pathlib.Path(path)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(data, indent=2))
  os.replace(tmp, path)
