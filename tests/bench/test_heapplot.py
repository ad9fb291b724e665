"""`python -m benchmarks heapplot` draws the heap layout that `aot --breakdown` records, and refuses clearly."""

from __future__ import annotations

import json

import pytest

from benchmarks import cli, heapplot
from labtools.analysis import heap
from tests.analysis.test_heap import ASSIGNMENT, LIVE_RANGE


def _doc(with_blocks: bool = True) -> dict:
  layout = heap.heap_layout(ASSIGNMENT, LIVE_RANGE)
  if not with_blocks:
    del layout[0]["blocks"]
  row = {"program": "ffn", "shape": "W3", "recipe": "int8_rtne", "breakdown": {"heap": layout}}
  return {"results": [row, {**row, "shape": "W1"}]}


def test_the_heap_plot_is_drawn_for_the_rows_asked_for(tmp_path):
  results = tmp_path / "aot.json"
  results.write_text(json.dumps(_doc()))
  out = tmp_path / "heap.png"
  args = cli.build_parser().parse_args(["heapplot", str(results), "--config", "W3", "--out", str(out)])
  args.func(args)
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert [t for t, _ in heapplot.panels(_doc(), "W3", [])] == ["int8_rtne W3"]


def test_the_heap_plot_refuses_rows_without_blocks_or_matches():
  with pytest.raises(SystemExit, match="no buffer blocks"):
    heapplot.panels(_doc(with_blocks=False), "W3", [])
  with pytest.raises(SystemExit, match="no row with a heap layout"):
    heapplot.panels(_doc(), "W9", [])
