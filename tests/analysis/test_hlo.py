"""The HLO text parser: computations, instructions, execution counts, buffers of the entry computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from labtools.analysis import hlo

TEXT = """HloModule m

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %f), metadata={op_name="jit(f)/while/body"}
}

ENTRY %main (x: f32[4,8]) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %w = (s32[], f32[4,8]{1,0}) while(%tup), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %n = f32[4,8]{1,0} negate(%x), metadata={op_name="jit(f)/neg" source_file="a.py"}
}
"""


def test_instructions_keep_type_operands_attributes_and_op_name():
  comps = hlo.parse_hlo(TEXT)
  assert set(comps) == {"body", "main"} and comps["main"].entry and not comps["body"].entry
  n = comps["main"].instrs[-1]
  assert (n.name, n.opcode, n.dtype, n.dims, n.operands, n.op_name) == (
    "n",
    "negate",
    "f32",
    (4, 8),
    ["x"],
    "jit(f)/neg",
  )
  t = comps["body"].instrs[-1]
  assert t.dtype is None and t.elements == 0 and hlo.array_types(t.type_text) == [("s32", ()), ("f32", (4, 8))]
  assert "metadata" not in t.attrs


def test_while_bodies_run_their_known_trip_count():
  counts, fused = hlo.execution_counts(hlo.parse_hlo(TEXT))
  assert counts == {"main": 1, "body": 3, "cond": 3} and fused == set()


def test_full_size_buffers_lists_entry_arrays_of_that_size_except_parameters():
  assert hlo.full_size_buffers(TEXT, 32) == [("n", "f32", "negate")]
  text = hlo.compiled_text(lambda x: jnp.sin(x) * 2, jax.ShapeDtypeStruct((4, 8), jnp.float32))
  assert [b[1] for b in hlo.full_size_buffers(text, 32)] == ["f32"]  # one fused output, the parameter not listed


NESTED = """HloModule m

%inner (a: s8[4,8], b: s8[8,2]) -> s32[4,2] {
  %a = s8[4,8]{1,0} parameter(0)
  %b = s8[8,2]{1,0} parameter(1)
  ROOT %d = s32[4,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%outer (x: s8[4,8], y: s8[8,2]) -> s32[4,2] {
  %x = s8[4,8]{1,0} parameter(0)
  %y = s8[8,2]{1,0} parameter(1)
  ROOT %f = s32[4,2]{1,0} fusion(%x, %y), kind=kCustom, calls=%inner
}

%conv (p: f32[1,4,4,2], k: f32[1,1,2,3]) -> f32[1,4,4,3] {
  %p = f32[1,4,4,2]{3,2,1,0} parameter(0)
  %k = f32[1,1,2,3]{3,2,1,0} parameter(1)
  ROOT %c = f32[1,4,4,3]{3,2,1,0} convolution(%p, %k), dim_labels=b01f_01io->b01f
}
"""


def test_find_dot_looks_into_the_computations_a_fusion_calls_and_counts_convolutions_only_when_asked():
  comps = hlo.parse_hlo(NESTED)
  found = hlo.find_dot(comps, "outer")
  assert found is not None
  dot, comp = found
  assert (dot.name, comp.name, dot.operands) == ("d", "inner", ["a", "b"])
  assert hlo.find_dot(comps, "conv") is None
  found = hlo.find_dot(comps, "conv", (*hlo.DOT_OPCODES, "convolution"))
  assert found is not None
  conv, _ = found
  assert conv.name == "c" and hlo.find_dot(comps, "missing") is None
