"""`s3r models`: every preset with total and active parameter counts, as text and JSON."""

import json
import os
import pathlib
import subprocess
import sys

from s3r import model as M

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args):
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "s3r.cli", "models", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  ).stdout


def test_models_json_lists_every_preset_with_published_counts():
  rows = {r["name"]: r for r in json.loads(_run("--json"))}
  assert list(rows) == list(M.PRESETS)
  for name, row in rows.items():
    assert row["params_total"] == M.param_count(M.PRESETS[name])
    assert row["params_active"] == M.active_param_count(M.PRESETS[name])
    assert row["counted_from"] == "shapes"
  assert rows["llama3.1-8b"]["params_total"] == 8_030_261_248 and rows["llama3.1-8b"]["counted_from"] == "shapes"
  assert rows["qwen3-30b-a3b"]["params_total"] == 30_532_122_624
  assert rows["qwen3-30b-a3b"]["params_active"] < rows["qwen3-30b-a3b"]["params_total"] // 8


def test_models_table_has_one_line_per_preset():
  lines = _run().strip().splitlines()
  assert len(lines) == 1 + len(M.PRESETS)
  assert any(line.split()[0] == "gemma3-12b" and "11,766,034,176" in line for line in lines)
