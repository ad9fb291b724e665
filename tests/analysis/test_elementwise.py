"""Per-element op counts read from HLO text: trip counts, loop fusions, bytes written."""

from __future__ import annotations

from labtools.analysis.elementwise import gradient_sized_ops


def test_ops_are_weighted_by_trip_counts_and_counted_per_element_of_loop_fusions():
  text = """HloModule m

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %f = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %f)
}

%fused (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %m = f32[4,8]{1,0} multiply(%a, %a)
  ROOT %s = f32[4,8]{1,0} add(%m, %a)
}

%bcast (v: f32[4], a: f32[4,8]) -> f32[4,8] {
  %v = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%v)
  %b = f32[4,8]{1,0} broadcast(%e), dimensions={0}
  %a = f32[4,8]{1,0} parameter(1)
  ROOT %m = f32[4,8]{1,0} multiply(%a, %b)
}

ENTRY %main (x: f32[4,8], v: f32[4]) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %v = f32[4]{0} parameter(1)
  %w = (s32[], f32[4,8]{1,0}) while(%tup), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %n = f32[4,8]{1,0} negate(%x)
  ROOT %g = f32[4,8]{1,0} fusion(%v, %n), kind=kLoop, calls=%bcast
}
"""
  out = gradient_sized_ops(text, 32)
  # the per-row exponential is evaluated once per output element of its loop fusion
  assert out["by_opcode"] == {"add": 5, "exponential": 1, "multiply": 6, "negate": 1}
  assert out["ops_per_element"] == 13
  assert out["shape_only_ops_per_element"] == 12
  # the fusion output in the loop (5x), the negate, the broadcast-multiply fusion
  assert out["written_bytes"]["f32"] == 5 * 32 * 4 + 32 * 4 + 32 * 4


def test_a_reduce_counts_once_per_reduced_operand_of_gradient_size():
  text = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[4,8], y: f32[4,8], v: f32[4]) -> f32[4] {
  %x = f32[4,8]{1,0} parameter(0)
  %y = f32[4,8]{1,0} parameter(1)
  %v = f32[4]{0} parameter(2)
  %z = f32[] constant(0)
  %r1 = f32[4]{0} reduce(%x, %z), dimensions={1}, to_apply=%add
  %r2 = (f32[4]{0}, f32[4]{0}) reduce(%x, %y, %z, %z), dimensions={1}, to_apply=%add
  ROOT %r3 = f32[] reduce(%v, %z), dimensions={0}, to_apply=%add
}
"""
  out = gradient_sized_ops(text, 32)
  # r1 reduces one gradient-sized operand, r2 two (its inits are not reduced), r3 none
  assert out["by_opcode"] == {"reduce": 3}
  assert out["reduce"] == 3 and out["elementwise"] == 0
  assert out["written_bytes"] == {}
