"""research.provenance: which revision and which uncommitted library changes each run of a sweep had."""

from __future__ import annotations

import json

from research import provenance


def test_library_changes_ignore_the_command_line_and_the_old_in_package_tooling():
  git = {"dirty_paths": ["s3r/quant/grouped.py", "s3r/cli/__init__.py", "s3r/experiments/sweep.py", "README.md"]}
  assert provenance.library_changes(git) == ["s3r/quant/grouped.py"]
  assert provenance.library_changes({}) == []


def test_sweep_provenance_counts_revisions_and_names_runs_with_library_changes(tmp_path, capsys):
  runs = tmp_path / "demo" / "runs"
  runs.mkdir(parents=True)
  summaries = {
    "a-s0": {"git": {"revision": "1" * 40, "dirty": False}, "meta": {"cpu": "Xeon", "jax": "0.11.2"}},
    "a-s1": {"git": {"revision": "1" * 40, "dirty": True, "dirty_paths": ["s3r/quant/ec.py"]}},
    "b-s0": {"git": {"revision": "2" * 40}},
    "b-s1": {},
  }
  for name, summary in summaries.items():
    (runs / f"{name}.json").write_text(json.dumps({"run": name, **summary}))
  p = provenance.sweep_provenance(tmp_path / "demo")
  assert p["runs"] == 4 and p["revisions"] == {"11111111": 2, "22222222": 1, "unrecorded": 1}
  assert p["library_changes"] == {"a-s1": ["s3r/quant/ec.py"]} and p["unrecorded_revision"] == ["b-s1"]
  assert p["cpus"] == {"Xeon": 1, "unrecorded": 3}
  assert provenance.main([str(tmp_path / "demo")]) == 0
  out = capsys.readouterr().out
  assert "demo: 4 runs from 3 revision(s)" in out and "a-s1: s3r/quant/ec.py" in out


def test_the_research_help_names_every_module_that_is_a_command():
  """`python -m research`'s docstring lists every research module with a `__main__` guard."""
  import importlib
  import pathlib
  import re

  folder = pathlib.Path(__file__).parents[2] / "research"
  commands = sorted(
    p.stem for p in folder.glob("*.py") if p.stem != "__main__" and '__name__ == "__main__"' in p.read_text()
  )
  main_doc = importlib.import_module("research.__main__").__doc__
  assert main_doc
  doc = " ".join(main_doc.split())
  assert commands and not [c for c in commands if not re.search(rf"\bresearch\.{c}\b", doc)]
