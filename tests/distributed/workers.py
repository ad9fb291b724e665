"""Programs the distributed tests run in subprocesses with simulated host devices.

Each is `python tests/distributed/workers.py NAME OUT_DIR [ARGS...]`; it writes its results
into OUT_DIR (npz arrays and a result.json) for the test to compare. Run with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see `run_worker` in conftest.py).
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# (fsdp, tensor) factorizations of 8 devices: pure FSDP, mixed, pure TP; None = one device.
QMATMUL_MESHES = (None, (8, 1), (4, 2), (2, 4), (1, 8))
QMATMUL_RECIPES = ("s3r", "s3r_bcast", "int8_sr", "s3r_ec", "int8_rtne")
B, S, K, N = 8, 16, 64, 48


def _mesh_name(shape) -> str:
  return "1" if shape is None else f"{shape[0]}x{shape[1]}"


def _operands():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, S, K)).astype(np.float32) * rng.uniform(0.1, 3, size=(B, S, 1)).astype(np.float32)
  w = rng.normal(size=(K, N)).astype(np.float32) * 0.1
  g = rng.normal(size=(B, S, N)).astype(np.float32) * rng.uniform(0.01, 1, size=(B, S, 1)).astype(np.float32)
  return x, w, g


def qmatmul_worker(out: pathlib.Path) -> None:
  """Thresholds, Q, Δ, dX and dW of one qmatmul on each mesh; the token dims (B, S) of x and of
  the upstream gradient are sharded over all 8 devices, the weight as in s3r train (fsdp, tensor)."""
  from s3r.quant import qmatmul, thresholds
  from s3r.quant.qmatmul import gradient_codes
  from s3r.train.hlo_collectives import collectives

  x, w, g = _operands()
  key = jax.random.key(7)
  result = {}
  for shape in QMATMUL_MESHES:
    f, t = shape or (1, 1)
    mesh = Mesh(np.asarray(jax.devices()[: f * t]).reshape(f, t), ("fsdp", "tensor"))
    tokens = NamedSharding(mesh, P("fsdp", "tensor", None))  # B over fsdp, S over tensor
    weight = NamedSharding(mesh, P("fsdp", "tensor"))
    xs, ws, gs = jax.device_put(x, tokens), jax.device_put(w, weight), jax.device_put(g, tokens)
    arrays, info = {}, {}
    for topology in ("token", "example"):
      fn = jax.jit(lambda k: thresholds.shared_thresholds(k, B, S, topology),
                   out_shardings=NamedSharding(mesh, P("fsdp", "tensor" if topology == "token" else None, None)))
      compiled = fn.lower(key).compile()
      arrays[f"u_{topology}"] = np.asarray(compiled(key))
      info[f"u_{topology}_collectives"] = len(collectives(compiled.as_text()))
    for recipe in QMATMUL_RECIPES:
      codes = jax.jit(lambda x, w, g: gradient_codes(x, w, g, key=key, recipe=recipe))
      q_dx, q_dw, delta = codes(xs, ws, gs)
      arrays[f"{recipe}_q_dx"], arrays[f"{recipe}_q_dw"] = np.asarray(q_dx), np.asarray(q_dw)
      arrays[f"{recipe}_delta"] = np.asarray(delta)
      grad = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: qmatmul(x, w, key=key, recipe=recipe), x, w)[1](g))
      compiled = grad.lower(xs, ws, gs).compile()
      dx, dw = compiled(xs, ws, gs)
      arrays[f"{recipe}_dx"], arrays[f"{recipe}_dw"] = np.asarray(dx), np.asarray(dw)
      colls = collectives(compiled.as_text())
      info[f"{recipe}_grad_collectives"] = [
          {"kind": c.kind, "dtype": c.dtype, "shapes": c.shapes, "op_name": c.op_name} for c in colls]
    np.savez(out / f"qmatmul_{_mesh_name(shape)}.npz", **arrays)
    result[_mesh_name(shape)] = info
  (out / "result.json").write_text(json.dumps(result))


def train_worker(out: pathlib.Path, recipe: str, steps: str, *meshes: str) -> None:
  """Losses and gradient norms of `steps` train steps of `tiny` on each mesh ('1' = one device)."""
  from s3r.train import loop
  from s3r.train.config import TrainConfig

  rng = np.random.default_rng(0)
  batches = [rng.integers(0, 512, (8, 33)).astype(np.int32) for _ in range(int(steps))]
  result = {}
  for spec in meshes:
    cfg = TrainConfig(out="unused", preset="tiny", recipe=recipe, steps=int(steps), warmup=1, batch=8, seq=32,
                      vocab=512, mesh=None if spec == "1" else spec)
    setup = loop.build(cfg, 512, loop.make_mesh(cfg))
    state = setup.init_state(setup.keys["init"])
    losses, norms = [], []
    for b in batches:
      state, m = setup.train_step(state, jax.device_put(b, setup.batch_sharding), setup.keys["train"])
      losses.append(float(m["loss"]))
      norms.append(float(m["grad_norm"]))
    result[spec] = {"losses": losses, "grad_norms": norms}
  (out / "result.json").write_text(json.dumps(result))


WORKERS = {"qmatmul": qmatmul_worker, "train": train_worker}

if __name__ == "__main__":
  WORKERS[sys.argv[1]](pathlib.Path(sys.argv[2]), *sys.argv[3:])
