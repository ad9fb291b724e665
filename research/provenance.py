"""Where the runs of a committed sweep come from: revision, uncommitted library changes, machine.

`python -m research.provenance [research/results/NAME ...]` reads the run summaries
(`research/results/NAME/runs/*.json`) of each sweep and prints, per sweep, how many runs each git revision
produced, which runs were trained with uncommitted changes to the library (paths under `s3r/`
other than its command line and, in older revisions, the research tooling then kept inside the
package: changes to those alone do not change what a run computes), and the CPU models and JAX
versions where the summaries record them (runs written before summaries recorded their machine
have none). It only reads; nothing is written.

A reader comparing two runs of one table should find them under one revision without library
changes; where they are not, the docs that quote the comparison say so (research/docs/results.md,
docs/moe.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

LIBRARY = "s3r/"
# Paths under s3r/ whose changes cannot change a run's numbers: the command line, and the research
# tooling that lived inside the package in older revisions.
NOT_NUMERICS = ("s3r/cli", "s3r/experiments/", "s3r/bench/", "s3r/results.py", "s3r/paper.py")


def library_changes(git: dict) -> list[str]:
  """The uncommitted paths of a run's tree that can change what it computes."""
  paths = git.get("dirty_paths") or []
  return [p for p in paths if p.startswith(LIBRARY) and not p.startswith(NOT_NUMERICS)]


def sweep_provenance(directory: pathlib.Path) -> dict:
  """Revisions (run counts), runs with library changes, CPU models and JAX versions of one sweep."""
  revisions, cpus, jaxes, changed, unknown = collections.Counter(), collections.Counter(), collections.Counter(), {}, []
  for path in sorted((directory / "runs").glob("*.json")):
    run = json.loads(path.read_text())
    git, meta = run.get("git") or {}, run.get("meta") or {}
    revision = git.get("revision")
    if revision is None:
      unknown.append(run["run"])
    revisions[revision[:8] if revision else "unrecorded"] += 1
    if paths := library_changes(git):
      changed[run["run"]] = paths
    cpus[meta.get("cpu", "unrecorded")] += 1
    jaxes[meta.get("jax", "unrecorded")] += 1
  return {
    "sweep": directory.name,
    "runs": sum(revisions.values()),
    "revisions": dict(revisions),
    "library_changes": changed,
    "unrecorded_revision": unknown,
    "cpus": dict(cpus),
    "jax": dict(jaxes),
  }


def report(p: dict) -> str:
  lines = [f"## {p['sweep']}: {p['runs']} runs from {len(p['revisions'])} revision(s)"]
  lines += [f"- {rev}: {n} run(s)" for rev, n in sorted(p["revisions"].items(), key=lambda kv: -kv[1])]
  if p["library_changes"]:
    lines.append("- trained with uncommitted library changes:")
    lines += [f"  - {run}: {', '.join(paths)}" for run, paths in p["library_changes"].items()]
  else:
    lines.append("- no run was trained with uncommitted library changes")
  lines.append("- CPU: " + "; ".join(f"{cpu} ({n})" for cpu, n in p["cpus"].items()))
  lines.append("- JAX: " + "; ".join(f"{v} ({n})" for v, n in p["jax"].items()))
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m research.provenance", description=__doc__.split("\n\n")[0])
  parser.add_argument("sweeps", nargs="*", help="sweep result folders (default: every research/results/*/runs)")
  args = parser.parse_args(argv)
  folders = [pathlib.Path(s) for s in args.sweeps] or sorted(
    p.parent for p in pathlib.Path("research/results").glob("*/runs")
  )
  missing = [str(f) for f in folders if not (f / "runs").is_dir()]
  if missing:
    parser.exit(2, f"{parser.prog}: error: no runs/ folder in {', '.join(missing)}\n")
  print("\n\n".join(report(sweep_provenance(f)) for f in folders))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
