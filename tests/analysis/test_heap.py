"""The heap layout of a temp allocation: what is live at once never exceeds it, agrees with XLA's own
peak, and names the buffer that sets the allocation's size."""

from __future__ import annotations

import pytest

from benchmarks import ffn
from labtools.analysis import heap, memory
from tests.analysis.test_memory import _args  # the FFN block's abstract arguments, T = 64, H = 32, D = 96


@pytest.fixture(scope="module", params=["bf16", "s3r_ec_dx"])
def found(request):
  b, _ = memory.buffer_breakdown(ffn.make_fwd_bwd(request.param).lower(*_args()))
  return b


def test_live_bytes_never_exceed_the_allocation_and_its_size_is_set_by_the_top_buffer(found):
  assert found["heap"], "XLA:CPU writes a live-range dump, so the layout exists"
  for h in found["heap"]:
    assert 0 < h["live_peak_bytes"] <= h["bytes"]
    assert sum(n for _, n in h["live_at_peak_by_type"].values()) == h["live_peak_bytes"]
    assert h["live_most_during_top_bytes"] <= h["live_peak_bytes"]
    top = h["top"]
    assert top["offset"] + top["bytes"] + h["above_top_bytes"] == h["bytes"]
    assert all(u["offset"] < top["offset"] and u["start"] <= top["end"] and u["end"] >= top["start"]
               for u in h["under_top"])  # fmt: skip
    gap = h["largest_gap_below_top"]
    assert 0 <= gap["offset"] and gap["offset"] + gap["bytes"] <= top["offset"]


def test_temporaries_xla_lists_at_its_peak_are_live_together_in_the_layout(found):
  """Two dumps, one answer: the temp buffers of XLA's peak list sum to no more than the layout's live peak."""
  temps_at_xla_peak = sum(p["bytes"] for p in found["peak"] if p["kind"] == "temp")
  assert temps_at_xla_peak <= sum(h["live_peak_bytes"] for h in found["heap"])


ASSIGNMENT = (
  "allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n"
  " value: <1 x.1 @0> (size=64,offset=0): f32[16]{0}\n"
  "allocation 1: size 448, preallocated-temp:\n"
  " value: <2 a @0> (size=128,offset=0): f32[32]{0}\n"
  " value: <3 b @0> (size=128,offset=128): f32[32]{0}\n"
  " value: <4 c @0> (size=192,offset=256): f32[48]{0}\n"
  " value: <5 tuple.1{0} @0> (size=128,offset=128): f32[32]{0}\n"
  " value: <6 d @0> (size=128,offset=0): f32[32]{0}\n"
)
# a: 0-2, b: 1-3 (its tuple alias tuple.1{0}: 3-4), c: 3-5, d: 5-6. At step 3 b and c are live (320 bytes);
# c could not go to offset 0 (a is gone, but 0-256 holds only 128 free bytes with b at 128) and sits at 256.
LIVE_RANGE = (
  "HloLiveRange (max 6):\n  InstructionSequence:\n    0:x.1\n  BufferLiveRange:\n"
  "    x.1{}:0-6\n    a{}:0-2\n    b{}:1-3\n    tuple.1{0}:3-4\n    c{}:3-5\n    d{}:5-6\n"
  "  Live ranges at 3 (peak):\n    c{}: 192 bytes\n"
)


def test_the_largest_free_span_below_the_top_buffer_is_found_with_its_bounds():
  assignment = (
    "allocation 1: size 512, preallocated-temp:\n"
    " value: <2 a @0> (size=64,offset=0): f32[16]{0}\n"
    " value: <3 b @0> (size=64,offset=192): f32[16]{0}\n"
    " value: <4 c @0> (size=256,offset=256): f32[64]{0}\n"
  )
  live_range = "  BufferLiveRange:\n    a{}:0-4\n    b{}:3-9\n    c{}:4-8\n"
  (h,) = heap.heap_layout(assignment, live_range)
  gap = h["largest_gap_below_top"]
  assert h["top"]["buffer"] == "c{}" and (gap["offset"], gap["bytes"]) == (64, 128)  # c needs 256: no fit
  assert [x["buffer"] for x in gap["above"]] == ["b{}"] and [x["buffer"] for x in gap["below"]] == ["a{}"]


def test_parse_live_ranges_reads_the_buffer_live_range_section():
  ranges = heap.parse_live_ranges(LIVE_RANGE)
  assert ranges == {"x.1{}": (0, 6), "a{}": (0, 2), "b{}": (1, 3), "tuple.1{0}": (3, 4), "c{}": (3, 5), "d{}": (5, 6)}


def test_a_fragmented_layout_names_its_top_buffer_and_what_was_below_it():
  (h,) = heap.heap_layout(ASSIGNMENT, LIVE_RANGE)
  assert h["bytes"] == 448 and h["live_peak_bytes"] == 320 and h["live_peak_step"] == 3  # 128 bytes unfilled
  assert [b["buffer"] for b in h["live_at_peak"]] == ["c{}", "b{}"]  # b and its alias count once
  assert h["live_at_peak_by_type"] == {"f32[48]": [1, 192], "f32[32]": [1, 128]}
  assert h["top"]["buffer"] == "c{}" and h["above_top_bytes"] == 0
  assert [u["buffer"] for u in h["under_top"]] == ["d{}", "b{}"]  # by offset
  assert h["largest_gap_below_top"]["bytes"] == 0  # below c, every byte is taken at some step of its life
