"""`python -m benchmarks merge`: two partial ffn runs join into one file; mismatched parts are refused."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks import cli


def _ffn_run(out_dir, shapes, *extra):
  args = cli.build_parser().parse_args(
    [
      "ffn",
      "--shapes",
      shapes,
      "--tokens",
      "32",
      "--repeats",
      "1",
      "--warmup",
      "0",
      "--recipes",
      "bf16,int8_rtne",
      "--no-chart",
      "--out-dir",
      str(out_dir),
      *extra,
    ]
  )
  args.func(args)
  return out_dir / f"bench_ffn_{jax.default_backend()}.json"


def _merge(tmp_path, *parts):
  args = cli.build_parser().parse_args(["merge", *map(str, parts), "--out", str(tmp_path / "merged"), "--no-chart"])
  args.func(args)
  return json.loads((tmp_path / "merged.json").read_text())


def test_merge_joins_the_shapes_of_two_runs_in_paper_order_and_keeps_each_runs_metadata(tmp_path):
  b = _ffn_run(tmp_path / "b", "64x128")
  a = _ffn_run(tmp_path / "a", "32x64")
  doc = _merge(tmp_path, b, a)
  assert [r["shape"] for r in doc["results"]] == ["64x128", "32x64"]  # custom shapes keep input order
  assert doc["complete"] is True
  from labtools.results import repo_relative  # the files as the metadata records paths (a clone may sit beside tmp)

  assert [p["file"] for p in doc["merged_from"]] == [repo_relative(str(b)), repo_relative(str(a))]
  assert all("git" in p["meta"] and "command" in p["meta"] for p in doc["merged_from"])
  md = (tmp_path / "merged.md").read_text()
  assert md.count("## part:") == 2 and "| 32x64 |" in md


def test_progress_writes_are_marked_incomplete_until_the_last_shape(tmp_path, monkeypatch):
  from labtools.results import Run

  writes = []
  real = Run.write
  monkeypatch.setattr(Run, "write", lambda self, *a, **k: writes.append(k.get("complete", True)) or real(self, *a, **k))
  _ffn_run(tmp_path, "32x64,64x128")
  assert writes == [False, False, True]


def test_merge_refuses_a_shape_measured_twice_and_different_settings(tmp_path):
  a = _ffn_run(tmp_path / "a", "32x64")
  b = _ffn_run(tmp_path / "b", "32x64")
  with pytest.raises(SystemExit, match="shape 32x64 is in both"):
    _merge(tmp_path, a, b)
  c = _ffn_run(tmp_path / "c", "64x128", "--seed", "1")
  with pytest.raises(SystemExit, match="settings .* differ"):
    _merge(tmp_path, a, c)
