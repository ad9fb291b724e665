"""The distributed fault pass: runs the two-process fault cases (the slow ones of
tests/distributed/test_peer_faults.py and test_peer_runtime.py) and prints one line per case and the tally.

  python scripts/fault_pass_distributed.py [-k EXPRESSION]

Each case starts `s3r train` as two processes (2 simulated CPU devices each, gloo) and hurts one of them (SIGKILL,
SIGKILL of the coordinator, SIGTERM, SIGSTOP, SIGKILL during a save; a model-free pair: a main thread that never
reaches its collective); a case passes when every process ended
within its deadline with the documented exit code and one console line, and the resumed run reproduces the
uninterrupted one. Exit code 0 when every case passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[1]
CASES = ["tests/distributed/test_peer_faults.py", "tests/distributed/test_peer_runtime.py"]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("-k", default=None, help="run only the cases whose names match (pytest -k)")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    report = pathlib.Path(tmp) / "cases.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-m", "slow", "-p", "no:cacheprovider", *CASES]
    command += [f"--junitxml={report}", *(["-k", args.k] if args.k else [])]
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if not report.exists():
      print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
      return 1
    cases = ET.parse(report).getroot().iter("testcase")
    rows = [(case.get("name", ""), _outcome(case), float(case.get("time", 0))) for case in cases]
  width = max((len(name) for name, _, _ in rows), default=10)
  for name, outcome, seconds in rows:
    print(f"{name:<{width}}  {outcome:<7}  {seconds:6.1f} s")
  passed = sum(outcome == "passed" for _, outcome, _ in rows)
  print(f"distributed fault pass: {passed}/{len(rows)} cases passed in {time.monotonic() - t0:.0f} s")
  if passed != len(rows):
    print(proc.stdout[-6000:], file=sys.stderr)
  return 0 if rows and passed == len(rows) else 1


def _outcome(case) -> str:
  for tag in ("failure", "error", "skipped"):
    if case.find(tag) is not None:
      return {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
  return "passed"


if __name__ == "__main__":
  sys.exit(main())
