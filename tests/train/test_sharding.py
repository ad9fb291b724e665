"""Mesh parsing, the partition-rule table, and a sharded step on 8 simulated CPU devices."""

import json
import os
import subprocess
import sys
import textwrap

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


_SHARDED_STEPS = textwrap.dedent("""
    import json, jax, numpy as np
    from s3r.train import loop
    from s3r.train.config import TrainConfig
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 300, (8, 33)).astype(np.int32) for _ in range(3)]
    out = {}
    for mesh in (None, "data=2,fsdp=2,tensor=2"):
      cfg = TrainConfig(out="unused", preset="tiny", recipe="s3r_ec_dx", steps=3, warmup=1, batch=8, seq=32,
                        vocab=300, mesh=mesh)
      setup = loop.build(cfg, 300, loop.make_mesh(cfg))
      state = setup.init_state(setup.keys["init"])
      losses = []
      for b in batches:
        state, m = setup.train_step(state, jax.device_put(b, setup.batch_sharding), setup.keys["train"])
        losses.append(float(m["loss"]))
      out[str(mesh)] = {"losses": losses, "devices": len(state.params["blocks"][0]["q"].sharding.device_set),
                        "q_spec": str(state.params["blocks"][0]["q"].sharding.spec)}
    print(json.dumps(out))
""")


def test_sharded_step_on_a_2x2x2_mesh_matches_one_device():
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", _SHARDED_STEPS], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  single, sharded = result["None"], result["data=2,fsdp=2,tensor=2"]
  assert single["devices"] == 1 and sharded["devices"] == 8
  assert sharded["q_spec"] == str(P("fsdp", "tensor"))
  assert sharded["losses"][0] == pytest.approx(single["losses"][0], rel=1e-4)  # same parameters
  assert sharded["losses"] == pytest.approx(single["losses"], rel=1e-2)  # reductions run in another order
