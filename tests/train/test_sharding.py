"""Mesh parsing and the partition-rule table."""

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from s3r.train.step import sharding as S

MESH_2x2x2 = AbstractMesh((2, 1, 2, 2), S.MESH_AXES)  # data x expert x fsdp x tensor
MESH_EP = AbstractMesh((2, 4, 1, 1), S.MESH_AXES)  # data=2, expert=4


def test_parse_mesh_accepts_any_factorization_of_the_device_count():
  assert S.parse_mesh(None, 8) == {"data": 1, "expert": 1, "fsdp": 1, "tensor": 1}
  assert S.parse_mesh("data=2,fsdp=2,tensor=2", 8) == {"data": 2, "expert": 1, "fsdp": 2, "tensor": 2}
  assert S.parse_mesh("fsdp=8", 8) == {"data": 1, "expert": 1, "fsdp": 8, "tensor": 1}
  assert S.parse_mesh("tensor=4, data=2", 8) == {"data": 2, "expert": 1, "fsdp": 1, "tensor": 4}
  assert S.parse_mesh("expert=4,data=2", 8) == {"data": 2, "expert": 4, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize(
  "spec, match",
  [
    ("data=3", "multiply to 8"),
    ("data=2,fsdp=2", "multiply to 8"),
    ("pipeline=8", "unknown axis 'pipeline'"),
    ("data=two", "size of data must be an integer >= 1, got 'two'"),
    ("data=0,fsdp=8", "size of data must be an integer >= 1, got '0'"),
    ("data=2.5,fsdp=4", "size of data must be an integer >= 1, got '2.5'"),
    ("data", "bad entry 'data'; expected AXIS=SIZE"),
    ("data=2,,fsdp=4", "bad entry ''; expected AXIS=SIZE"),
    ("data=2,data=4", "axis data is given twice"),
    ("data=8,data=1", "axis data is given twice"),
  ],
)
def test_parse_mesh_rejects_other_specs_with_a_message_naming_the_flag_and_the_entry(spec, match):
  with pytest.raises(ValueError, match=match) as e:
    S.parse_mesh(spec, 8)
  assert str(e.value).startswith(f"--mesh {spec}: ")


def test_rules_shard_fsdp_over_width_tensor_over_heads_and_batch_over_data_and_fsdp():
  assert S.mesh_spec(P("embed", "heads"), (64, 64), MESH_2x2x2) == P("fsdp", "tensor")  # q: column parallel
  assert S.mesh_spec(P("heads", "embed"), (64, 64), MESH_2x2x2) == P("tensor", "fsdp")  # o: row parallel
  assert S.mesh_spec(P("mlp", "embed"), (192, 64), MESH_2x2x2) == P("tensor", "fsdp")  # down: row parallel
  assert S.mesh_spec(P("norm"), (64,), MESH_2x2x2) == P(None)
  assert S.mesh_spec(P("batch", "seq"), (8, 33), MESH_2x2x2) == P(("data", "fsdp"), None)
  assert S.mesh_spec(P("batch", "seq", "act_mlp"), (8, 32, 192), MESH_2x2x2) == P(("data", "fsdp"), None, "tensor")


def test_expert_weights_shard_over_the_expert_axis_and_the_batch_over_data_and_expert():
  assert S.mesh_spec(P("expert", "embed", "mlp"), (8, 64, 32), MESH_EP) == P("expert", None, None)
  assert S.mesh_spec(P("expert", "embed", "mlp"), (8, 64, 32), MESH_2x2x2) == P(None, "fsdp", "tensor")
  assert S.mesh_spec(P("batch", "seq"), (8, 33), MESH_EP) == P(("data", "expert"), None)
  assert S.mesh_spec(P("expert", "mlp", "embed"), (6, 32, 64), MESH_EP) == P(None, None, None)  # 4 does not divide 6


def test_a_dimension_the_mesh_does_not_divide_stays_replicated():
  assert S.mesh_spec(P("vocab", "embed"), (301, 64), MESH_2x2x2) == P(None, "fsdp")
  assert S.mesh_spec(P("batch", "seq"), (2, 33), MESH_2x2x2) == P(None, None)


# Sharded train steps on 8 simulated devices (1, 8x1, 1x8, 2x2x2 meshes) are tested in
# tests/distributed/test_mesh_independence.py and tests/distributed/test_tensor_parallel.py.
