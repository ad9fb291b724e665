"""Mesh parsing and the partition-rule table."""

import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from s3r.train import sharding as S

MESH_2x2x2 = AbstractMesh((2, 2, 2), S.MESH_AXES)


def test_parse_mesh_accepts_any_factorization_of_the_device_count():
  assert S.parse_mesh(None, 8) == {"data": 1, "fsdp": 1, "tensor": 1}
  assert S.parse_mesh("data=2,fsdp=2,tensor=2", 8) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert S.parse_mesh("fsdp=8", 8) == {"data": 1, "fsdp": 8, "tensor": 1}
  assert S.parse_mesh("tensor=4, data=2", 8) == {"data": 2, "fsdp": 1, "tensor": 4}


@pytest.mark.parametrize("spec, match", [
    ("data=3", "multiply to 8"),
    ("data=2,fsdp=2", "multiply to 8"),
    ("pipeline=8", "AXIS=SIZE"),
    ("data=two", "AXIS=SIZE"),
    ("data=0,fsdp=8", "AXIS=SIZE"),
])
def test_parse_mesh_rejects_other_specs_with_a_clear_message(spec, match):
  with pytest.raises(ValueError, match=match):
    S.parse_mesh(spec, 8)


def test_rules_shard_fsdp_over_width_tensor_over_heads_and_batch_over_data_and_fsdp():
  assert S.mesh_spec(P("embed", "heads"), (64, 64), MESH_2x2x2) == P("fsdp", "tensor")  # q: column parallel
  assert S.mesh_spec(P("heads", "embed"), (64, 64), MESH_2x2x2) == P("tensor", "fsdp")  # o: row parallel
  assert S.mesh_spec(P("mlp", "embed"), (192, 64), MESH_2x2x2) == P("tensor", "fsdp")  # down: row parallel
  assert S.mesh_spec(P("norm"), (64,), MESH_2x2x2) == P(None)
  assert S.mesh_spec(P("batch", "seq"), (8, 33), MESH_2x2x2) == P(("data", "fsdp"), None)
  assert S.mesh_spec(P("batch", "seq", "act_mlp"), (8, 32, 192), MESH_2x2x2) == P(("data", "fsdp"), None, "tensor")


def test_a_dimension_the_mesh_does_not_divide_stays_replicated():
  assert S.mesh_spec(P("vocab", "embed"), (301, 64), MESH_2x2x2) == P(None, "fsdp")
  assert S.mesh_spec(P("batch", "seq"), (2, 33), MESH_2x2x2) == P(None, None)


# Sharded train steps on 8 simulated devices (1, 8x1, 1x8, 2x2x2 meshes) are tested in
# tests/distributed/test_mesh_independence.py and tests/distributed/test_tensor_parallel.py.
