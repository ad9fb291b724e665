"""Reading collectives and their bytes from compiled HLO text (labtools.analysis.collectives)."""

import pytest

from labtools.analysis.collectives import collectives, volume

HLO = """
ENTRY %main {
  %all-reduce.1 = s32[64,64]{1,0} all-reduce(%f), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(step)/jvp()/dot_general"}
  %all-reduce.2 = (f32[32]{0}, f32[], /*index=2*/bf16[8,4]{1,0}) all-reduce(%a, %b, %c), channel_id=2, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%max
  %all-gather.3 = s8[64,96]{1,0} all-gather(%w), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true
  ROOT %reduce-scatter.4 = f32[16,8]{1,0} reduce-scatter(%g), channel_id=4, replica_groups=[1,8]<=[8], dimensions={1}, to_apply=%add
  %collective-permute.5 = f32[4]{0} collective-permute(%p), channel_id=5, source_target_pairs={{0,0},{1,1}}
  %all-gather-start.6 = (f32[2,8]{1,0}, f32[8,8]{1,0}) all-gather-start(%q), channel_id=6, replica_groups=[2,4]<=[8], dimensions={0}
  %all-gather-done.6 = f32[8,8]{1,0} all-gather-done(%all-gather-start.6)
  %add.7 = f32[4]{0} add(%x, %y)
}
"""


def test_collectives_are_split_by_element_type_with_their_buffer_bytes_and_groups():
  found = {(c.name, c.dtype): c for c in collectives(HLO)}
  assert sorted(found) == [
    ("all-gather-start.6", "f32"),
    ("all-gather.3", "s8"),
    ("all-reduce.1", "s32"),
    ("all-reduce.2", "bf16"),
    ("all-reduce.2", "f32"),
    ("collective-permute.5", "f32"),
    ("reduce-scatter.4", "f32"),
  ]
  ar = found[("all-reduce.1", "s32")]
  assert (ar.kind, ar.bytes, ar.group_size, ar.op_name) == ("all-reduce", 64 * 64 * 4, 2, "jit(step)/jvp()/dot_general")
  assert ar.wire_bytes == pytest.approx(ar.bytes)  # ring all-reduce over 2 devices: 2 (n-1)/n = 1
  assert found[("all-reduce.2", "f32")].bytes == (32 + 1) * 4 and found[("all-reduce.2", "f32")].group_size == 4
  assert found[("all-reduce.2", "bf16")].bytes == 8 * 4 * 2
  ag = found[("all-gather.3", "s8")]
  assert (ag.bytes, ag.group_size) == (64 * 96, 4) and ag.wire_bytes == pytest.approx(64 * 96 * 3 / 4)
  rs = found[("reduce-scatter.4", "f32")]  # the operand before scattering along dimension 1
  assert rs.shapes == ((16, 64),) and rs.bytes == 16 * 64 * 4 and rs.group_size == 8
  assert found[("collective-permute.5", "f32")].wire_bytes == 0  # every device sends to itself
  assert found[("all-gather-start.6", "f32")].shapes == ((8, 8),)  # async: counted once, the gathered result


def test_volume_sums_bytes_by_kind_and_element_type():
  v = volume(collectives(HLO))
  assert v["all-reduce"] == {"s32": 64 * 64 * 4, "f32": 33 * 4, "bf16": 64}
  assert v["all-gather"] == {"s8": 64 * 96, "f32": 8 * 8 * 4}
  assert set(v) == {"all-reduce", "all-gather", "reduce-scatter", "collective-permute"}


def test_a_mesh_replica_group_over_a_sub_axis_counts_the_sub_axis_devices():
  # XLA 0.11's text for a group of 4 devices of an 8-device axis: the sub-axis 'tensor':(2)4
  hlo = """
ENTRY %main {
  ROOT %all-reduce.1 = f32[16]{0} all-reduce(%x), channel_id=16, replica_groups=mesh['data'=1,'expert'=1,'fsdp'=2,'tensor'=8] {'tensor':(2)4}, to_apply=%add
  %all-reduce.2 = f32[16]{0} all-reduce(%y), channel_id=17, replica_groups=mesh['fsdp'=2,'tensor'=8] {'fsdp','tensor':(4)2}, to_apply=%add
}
"""
  sizes = {c.name: c.group_size for c in collectives(hlo)}
  assert sizes == {"all-reduce.1": 4, "all-reduce.2": 4}
