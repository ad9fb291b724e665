"""Results files: metadata (command relative to the repository root), heading, tables, charts."""

from __future__ import annotations

import json
import re

from labtools.results import REPO_ROOT, Run, bar_chart, command_line, markdown_table


def test_results_files_record_required_metadata(tmp_path, monkeypatch):
  monkeypatch.setattr("sys.argv", ["s3r", "models", "--json"])
  run = Run("unit", tmp_path, title="s3r unit results", alpha=1, beta="x")
  paths = run.write(
    {"rows": [1, 2]},
    markdown_table(["a", "b"], [[1, 2]]),
    chart=lambda p: bar_chart(p, ["g1", "g2"], {"s": [1.0, None]}, ylabel="y", title="t"),
  )
  assert set(paths) == {"json", "md", "png"}
  assert paths["json"].name == f"bench_unit_{run.meta['platform']}.json"
  doc = json.loads(paths["json"].read_text())
  meta = doc["meta"]
  assert meta["command"] == "s3r models --json"
  assert re.fullmatch(r"[0-9a-f]{40}", meta["git"]["revision"])
  assert isinstance(meta["git"]["dirty"], bool)
  assert isinstance(meta["git"]["dirty_paths"], list) and meta["git"]["dirty"] == bool(meta["git"]["dirty_paths"])
  for key in ("jax_version", "jaxlib_version", "platform", "device_kind", "cpu_model", "cpu_count", "date_utc"):
    assert meta[key], key
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["date_utc"])
  assert len(meta["loadavg_before"]) == 3 and len(meta["loadavg_after"]) == 3
  assert doc["settings"] == {"alpha": 1, "beta": "x"}
  assert doc["results"] == {"rows": [1, 2]}
  md = paths["md"].read_text()
  for needle in (
    "s3r models --json",
    meta["git"]["revision"],
    "load average",
    meta["jax_version"],
    "| a | b |",
  ):
    assert needle in md
  assert md.startswith("# s3r unit results\n\n- command: ")
  assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_table_escapes_and_aligns():
  table = markdown_table(["name", "value"], [["a|b", 1.5], ["c", None]])
  assert table.splitlines() == ["| name | value |", "| --- | --: |", "| a\\|b | 1.5 |", "| c |  |"]


def test_command_names_a_script_and_its_path_arguments_relative_to_the_repository_root(monkeypatch):
  script = REPO_ROOT / "docs" / "example.py"
  monkeypatch.setattr("sys.argv", [str(script), "--out", str(REPO_ROOT / "results" / "x"), "--data", "/elsewhere/c"])
  assert command_line() == "docs/example.py --out results/x --data /elsewhere/c"
  monkeypatch.setattr("sys.argv", ["/usr/local/bin/s3r", "models"])
  assert command_line() == "s3r models"
