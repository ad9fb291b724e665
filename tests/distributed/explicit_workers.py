"""Programs of the explicit-sharding tests (meshes with `AxisType.Explicit` axes), run by workers.py.

`explicit_ops`: qmatmul, grouped_qmatmul and a Linen `Dense` with `LinenDotGeneral` under explicit
("batch", "model") meshes, their gradients next to those of the unsharded program (explicit_ops.npz).
`explicit_minigpt`: the NNX miniGPT fixture (tests/nn/minigpt.py), quantized with `s3r.nn.quantize`,
trained a few steps on a 1-device and on an 8-device explicit mesh: losses and first-step
gradients (minigpt_*.npz).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jax.sharding import reshard

# one recipe of each kind of backward: bf16, integer GEMMs, S3R-EC's float corrections, exact f32
OPS_RECIPES = ("bf16", "s3r", "s3r_ec", "int8_exact_bwd")
# (mesh shape, x spec, w spec): batch and tokens sharded, the output features, or the contraction (K)
OPS_LAYOUTS = {
  "tokens_columns": ((4, 2), P("batch", None, None), P(None, "model")),
  "tokens_both_axes": ((4, 2), P("batch", "model", None), P(None, "model")),
  "contraction": ((2, 4), P("batch", None, "model"), P("model", None)),
}
B, S, K, N, E = 8, 16, 64, 48, 4


def operands():
  """x [B, S, K] with per-token scales, w [K, N], an upstream g [B, S, N]: the mesh workers' qmatmul operands."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, S, K)).astype(np.float32) * rng.uniform(0.1, 3, size=(B, S, 1)).astype(np.float32)
  w = rng.normal(size=(K, N)).astype(np.float32) * 0.1
  g = rng.normal(size=(B, S, N)).astype(np.float32) * rng.uniform(0.01, 1, size=(B, S, 1)).astype(np.float32)
  return x, w, g


def _vjp(fn, g):
  return jax.jit(lambda *args: jax.vjp(fn, *args)[1](g))


def explicit_ops_worker(out: pathlib.Path) -> None:
  """dX, dW of qmatmul (every recipe in OPS_RECIPES), grouped_qmatmul and a Linen Dense, unsharded
  (key "ref") and on each layout of OPS_LAYOUTS; result.json holds the shardings of the results."""
  import flax.linen as linen

  import s3r

  x, w, g = operands()
  key = jax.random.key(7)
  sizes = np.array([40, 0, 56, 24], np.int32)  # 120 of the 128 rows, one empty expert
  we = np.stack([w * (1 + e) for e in range(E)])
  dense = linen.Dense(N, use_bias=False, dot_general_cls=lambda: s3r.nn.LinenDotGeneral(recipe="s3r"))
  programs = {
    **{r: (lambda x, w, r=r: s3r.qmatmul(x, w, key=key, recipe=r), (x, w), g) for r in OPS_RECIPES},
    "grouped": (
      lambda x, w: s3r.grouped_qmatmul(x, w, jnp.asarray(sizes), key=key, recipe="s3r"),
      (x.reshape(-1, K), we),
      g.reshape(-1, N),
    ),
    "linen": (lambda x, w: dense.apply({"params": {"kernel": w}}, x, rngs={"quant": key}), (x, w), g),
  }
  arrays, info = {}, {}
  for name, (fn, args, ct) in programs.items():
    arrays.update({f"ref_{name}_{i}": np.asarray(d) for i, d in enumerate(_vjp(fn, ct)(*args))})
  for layout, (shape, x_spec, w_spec) in OPS_LAYOUTS.items():
    mesh = jax.make_mesh(shape, ("batch", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
      for name, (fn, args, ct) in programs.items():
        # grouped: x [T, K] with the tokens over "batch" and K as in x, w [E, K, N] as w
        specs = (P("batch", x_spec[2]), P(None, *w_spec)) if name == "grouped" else (x_spec, w_spec)
        sharded = [reshard(a, s) for a, s in zip(args, specs)]
        y = jax.eval_shape(fn, *sharded)
        grads = _vjp(fn, reshard(ct, y.sharding.spec))(*sharded)
        arrays.update({f"{layout}_{name}_{i}": np.asarray(d) for i, d in enumerate(grads)})
        info[f"{layout}_{name}"] = {
          "y": str(y.sharding.spec),
          "grads": [str(d.sharding.spec) for d in grads],
          "inputs": [str(a.sharding.spec) for a in sharded],
        }
  np.savez(out / "explicit_ops.npz", **arrays)
  (out / "result.json").write_text(json.dumps(info))


MINIGPT_RUNS = {  # name: (mesh shape, recipe, key seed of the quantization stream)
  "1:bf16": ((1, 1), "bf16", 1),
  "8:bf16": ((4, 2), "bf16", 1),
  "1:s3r_ec_dx": ((1, 1), "s3r_ec_dx", 1),
  "1:s3r_ec_dx:other_key": ((1, 1), "s3r_ec_dx", 2),
  "8:s3r_ec_dx": ((4, 2), "s3r_ec_dx", 1),
}


def _train_minigpt(shape, recipe: str, seed: int, steps: int):
  import optax
  from flax import nnx

  import s3r
  from tests.nn import minigpt

  with jax.set_mesh(minigpt.explicit_mesh(*shape)):
    model = minigpt.MiniGPT(rngs=nnx.Rngs(0))
    s3r.nn.quantize(model, recipe, rngs=seed)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, inputs, targets):
      loss, grads = nnx.value_and_grad(minigpt.loss_fn)(model, inputs, targets)
      optimizer.update(model, grads)
      return loss, grads

    inputs, targets = (reshard(a, minigpt.batch_spec()) for a in minigpt.batch(8))
    losses, kernel_spec = [], ""
    first: dict[str, Any] = {}  # the first step's gradients, by path
    for i in range(steps):
      loss, grads = step(model, optimizer, inputs, targets)
      losses.append(float(loss))
      if i == 0:
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))[0]
        first |= {jax.tree_util.keystr(p): np.asarray(v) for p, v in flat}
        sharding = model.blocks[0].linear1.kernel[...].sharding
        assert isinstance(sharding, jax.sharding.NamedSharding)
        kernel_spec = str(sharding.spec)
  return losses, first, kernel_spec


def explicit_minigpt_worker(out: pathlib.Path, steps: str = "3") -> None:
  """Losses of `steps` train steps and the first step's gradients of each MINIGPT_RUNS entry."""
  info: dict[str, dict[str, Any]] = {}
  for name, (shape, recipe, seed) in MINIGPT_RUNS.items():
    losses, grads, kernel_spec = _train_minigpt(shape, recipe, seed, int(steps))
    np.savez(out / f"minigpt_{name.replace(':', '_')}.npz", **grads)
    info[name] = {"losses": losses, "kernel_spec": kernel_spec, "devices": shape[0] * shape[1]}
  (out / "result.json").write_text(json.dumps(info))
