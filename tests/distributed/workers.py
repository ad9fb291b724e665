"""Programs the distributed tests run in subprocesses with simulated host devices.

Each is `python tests/distributed/workers.py NAME OUT_DIR [ARGS...]`; it writes its results
into OUT_DIR (npz arrays and a result.json) for the test to compare. Run with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see `run_worker` in conftest.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from labtools.analysis.hlo import hlo_text
from tests.distributed.explicit_workers import B, S, explicit_minigpt_worker, explicit_ops_worker, operands

# (fsdp, tensor) factorizations of 8 devices: pure FSDP, mixed, pure TP; None = one device.
QMATMUL_MESHES = (None, (8, 1), (4, 2), (2, 4), (1, 8))
QMATMUL_RECIPES = ("s3r", "s3r_bcast", "int8_sr", "s3r_ec", "int8_rtne")


def _mesh_name(shape) -> str:
  return "1" if shape is None else f"{shape[0]}x{shape[1]}"


def qmatmul_worker(out: pathlib.Path) -> None:
  """Thresholds, Q, Δ, dX and dW of one qmatmul on each mesh; the token dims (B, S) of x and of
  the upstream gradient are sharded over all 8 devices, the weight as in s3r train (fsdp, tensor)."""
  from labtools.analysis.collectives import collectives
  from s3r.quant import qmatmul, thresholds
  from s3r.quant.matmul import gradient_codes

  x, w, g = operands()
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
      fn = jax.jit(
        lambda k: thresholds.shared_thresholds(k, B, S, topology),
        out_shardings=NamedSharding(mesh, P("fsdp", "tensor" if topology == "token" else None, None)),
      )
      compiled = fn.lower(key).compile()
      arrays[f"u_{topology}"] = np.asarray(compiled(key))
      info[f"u_{topology}_collectives"] = len(collectives(hlo_text(compiled)))
    for recipe in QMATMUL_RECIPES:
      codes = jax.jit(lambda x, w, g: gradient_codes(x, w, g, key=key, recipe=recipe))
      q_dx, q_dw, delta = codes(xs, ws, gs)
      arrays[f"{recipe}_q_dx"], arrays[f"{recipe}_q_dw"] = np.asarray(q_dx), np.asarray(q_dw)
      arrays[f"{recipe}_delta"] = np.asarray(delta)
      grad = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: qmatmul(x, w, key=key, recipe=recipe), x, w)[1](g))
      compiled = grad.lower(xs, ws, gs).compile()
      dx, dw = compiled(xs, ws, gs)
      arrays[f"{recipe}_dx"], arrays[f"{recipe}_dw"] = np.asarray(dx), np.asarray(dw)
      colls = collectives(hlo_text(compiled))
      info[f"{recipe}_grad_collectives"] = [
        {"kind": c.kind, "dtype": c.dtype, "shapes": c.shapes, "op_name": c.op_name} for c in colls
      ]
    np.savez(out / f"qmatmul_{_mesh_name(shape)}.npz", **arrays)
    result[_mesh_name(shape)] = info
  (out / "result.json").write_text(json.dumps(result))


def tp_worker(out: pathlib.Path) -> None:
  """One qmatmul on a pure tensor-parallel mesh of 8 devices with bf16 activations: the output of
  a row-parallel weight (W split along K) and dX of a column-parallel one (W split along N),
  with per-shard bf16 partial sums (tp=...) and with exact int32 ones (tp=None); also dW of
  int8_rtne with W replicated and split (the same codes X̂ must serve both programs)."""
  from labtools.analysis.collectives import collectives
  from s3r.quant import qmatmul
  from s3r.quant.matmul import gradient_codes

  x, w, g = operands()
  x, g = x.astype(jnp.bfloat16), g.astype(jnp.bfloat16)
  key = jax.random.key(7)
  mesh = Mesh(np.asarray(jax.devices()), ("tensor",))
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  arrays, info = {"x": np.asarray(x, np.float32), "w": w, "g": np.asarray(g, np.float32)}, {}
  for recipe in ("int8_rtne", "s3r", "s3r_ec_dx", "bf16"):
    for tp in (None, "row", "column"):

      def f(x, w, tp=tp):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
          return qmatmul(x, w, key=key, recipe=recipe, tp=tp)

      w_spec = ("tensor", None) if tp == "row" else (None, "tensor")
      xs, ws = put(x, None, None, "tensor" if tp == "row" else None), put(w, *w_spec)
      fwd = jax.jit(f).lower(xs, ws).compile()
      grad = jax.jit(lambda x, w, g: jax.vjp(f, x, w)[1](g)).lower(xs, ws, put(g)).compile()
      dx, dw = grad(xs, ws, put(g))
      name = f"{recipe}_{tp or 'exact'}"
      arrays[f"{name}_y"], arrays[f"{name}_dx"] = np.asarray(fwd(xs, ws), np.float32), np.asarray(dx, np.float32)
      info[name] = [
        {"kind": c.kind, "dtype": c.dtype, "shapes": c.shapes, "op_name": c.op_name}
        for c in collectives(hlo_text(fwd)) + collectives(hlo_text(grad))
      ]
    if recipe == "bf16":
      continue
    q_dx, _, delta = jax.jit(lambda x, w, g: gradient_codes(x, w, g, key=key, recipe=recipe))(x, w, g)
    arrays[f"{recipe}_q"], arrays[f"{recipe}_delta"] = np.asarray(q_dx), np.asarray(delta)
  rtne_dw = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: qmatmul(x, w, recipe="int8_rtne"), x, w)[1](g)[1])
  arrays["rtne_dw_replicated"] = np.asarray(rtne_dw(x, w, g))
  arrays["rtne_dw_split"] = np.asarray(rtne_dw(x, put(w, None, "tensor"), g))
  np.savez(out / "tp.npz", **arrays)
  (out / "result.json").write_text(json.dumps(info))


def projection_deltas(setup, params, batch, train_key) -> tuple[list[float], dict]:
  """The step Δ of every projection's backward in the first train step (layer-major, q..down):
  the upstream gradient G of each projection (the gradient of a zero offset on its output,
  research.taps), quantized by `gradient_codes` under the run's shardings; and the operands x, w, G
  (gathered)."""
  from research import taps
  from s3r import model as s3r_model
  from s3r.quant.matmul import gradient_codes
  from s3r.train.step import cross_entropy, sharding

  cfg = setup.model_cfg
  widths = {
    "q": cfg.n_heads * cfg.head_dim,
    "k": cfg.n_kv_heads * cfg.head_dim,
    "v": cfg.n_kv_heads * cfg.head_dim,
    "o": cfg.d_model,
    "gate": cfg.d_ff,
    "up": cfg.d_ff,
    "down": cfg.d_model,
  }
  b, s = batch.shape[0], batch.shape[1] - 1
  step_key = jax.random.fold_in(train_key, 0)

  def deltas(params, batch):
    def loss(offsets):
      tapped = taps.Taps(offsets=offsets, record=True)
      logits, per_layer = taps.apply(cfg, params, batch[:, :-1], key=step_key, taps=tapped)
      return cross_entropy(logits, batch[:, 1:]), [a["projections"] for a in per_layer]

    zeros = {n: jnp.zeros((b, s, widths[n]), jnp.float32) for n in s3r_model.PROJECTIONS}
    offsets = [dict(zeros) for _ in range(cfg.n_layers)]
    g, seen = jax.grad(loss, has_aux=True)(offsets)
    found = [(*seen[i][n], g[i][n]) for i in range(cfg.n_layers) for n in s3r_model.PROJECTIONS]
    ds = jnp.stack([gradient_codes(x, w, gi, key=k, recipe=cfg.recipe)[2] for x, w, k, gi in found])
    return ds, [(x.astype(jnp.float32), w, gi) for x, w, _, gi in found]

  fn = jax.jit(sharding.with_activation_sharding(deltas, setup.mesh))
  ds, operands = fn(params, jax.device_put(batch, setup.batch_sharding))
  arrays = {f"{name}_{i}": np.asarray(a) for i, ops in enumerate(operands) for name, a in zip("xwg", ops)}
  return [float(d) for d in ds], arrays


def train_worker(out: pathlib.Path, recipe: str, steps: str, *meshes: str) -> None:
  """Losses and gradient norms of `steps` train steps of `tiny` on each mesh ('1' = one device;
  a ':int32' suffix selects exact tensor-parallel partial sums, otherwise per-shard bf16),
  the sharding of one weight, the collectives of the compiled step, and (meshes marked with a
  trailing '+delta') the step Δ of every projection in the first step."""
  from labtools.analysis.collectives import collectives
  from s3r.train import loop
  from s3r.train.config import TrainConfig

  rng = np.random.default_rng(0)
  batches = [rng.integers(0, 512, (8, 33)).astype(np.int32) for _ in range(int(steps))]
  result = {}
  for name in meshes:
    name, want_deltas = name.removesuffix("+delta"), name.endswith("+delta")
    spec, _, partial_sums = name.partition(":")  # "tensor=8:int32": exact tensor-parallel partial sums
    cfg = TrainConfig(
      out="unused",
      preset="tiny",
      recipe=recipe,
      steps=int(steps),
      warmup=1,
      batch=8,
      seq=32,
      vocab=512,
      mesh=None if spec == "1" else spec,
      tp_partial_sums=partial_sums or "bf16",
    )
    setup = loop.build(cfg, 512, loop.make_mesh(cfg))
    state = setup.init_state(setup.keys["init"])
    deltas = None
    if want_deltas:
      deltas, operands = projection_deltas(setup, state.params, batches[0], setup.keys["train"])
      np.savez(out / f"operands_{name}.npz", **operands)
    tokens = jax.ShapeDtypeStruct((8, 33), np.int32, sharding=setup.batch_sharding)
    step = setup.train_step.lower(state, tokens, setup.keys["train"]).compile()
    losses, norms = [], []
    for b in batches:
      state, m = step(state, jax.device_put(b, setup.batch_sharding), setup.keys["train"])
      losses.append(float(m["loss"]))
      norms.append(float(m["grad_norm"]))
    q = state.params["layers"]["q"]  # stacked over the layers (the layer axis unsharded)
    result[name] = {
      "losses": losses,
      "grad_norms": norms,
      "devices": len(q.sharding.device_set),
      "q_spec": str(q.sharding.spec),
      "tokens": 8 * 32,
      "deltas": deltas,
      "collectives": [
        {"kind": c.kind, "dtype": c.dtype, "shapes": c.shapes, "group_size": c.group_size, "op_name": c.op_name}
        for c in collectives(hlo_text(step))
      ],
    }
  (out / "result.json").write_text(json.dumps(result))


def cli_flags(corpus: str, cache: str, out: str, *extra: str) -> list[str]:
  """`s3r train` flags of the sharded CLI runs: 4 `tiny` steps, checkpoints at 2 and 4."""
  return [
    "train",
    "--preset",
    "tiny",
    "--recipe",
    "s3r",
    "--steps",
    "4",
    "--warmup",
    "1",
    "--batch",
    "8",
    "--seq",
    "32",
    "--vocab",
    "300",
    "--data",
    corpus,
    "--cache-dir",
    cache,
    "--eval-every",
    "4",
    "--eval-batches",
    "1",
    "--ckpt-every",
    "2",
    "--no-progress",
    "--out",
    out,
    *extra,
  ]


def _metrics(run: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoint_worker(out: pathlib.Path, corpus: str, cache: str) -> None:
  """`s3r train` on a 4x2 (fsdp x tensor) mesh of 8 devices, checkpoints at steps 2 and 4; its
  step-2 checkpoint resumed on 2x4 and on one device; and that checkpoint restored onto each
  mesh (the restored state saved to npz for a bitwise comparison)."""
  import shutil

  from s3r import cli
  from s3r.train import loop
  from s3r.train.config import TrainConfig
  from s3r.train.run import checkpoint

  first_mesh = "fsdp=4,tensor=2"
  meshes = {"4x2": first_mesh, "2x4": "fsdp=2,tensor=4", "1": None}
  run = out / "run_4x2"
  assert cli.main(cli_flags(corpus, cache, str(run), "--mesh", first_mesh)) == 0
  result: dict[str, Any] = {"4x2": _metrics(run)}
  for name in ("2x4", "1"):
    copy = out / f"resumed_{name}"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "4")
    spec = meshes[name]
    mesh = ["--mesh", spec] if spec else []
    assert cli.main(cli_flags(corpus, cache, str(copy), "--resume", *mesh)) == 0
    result[f"resumed_{name}"] = _metrics(copy)
  ckpt = checkpoint.Checkpointer(run / "checkpoints", create=False)
  saved = TrainConfig.from_dict(ckpt.read_meta(2)["train_config"])
  result["restored"] = {}
  for name, spec in meshes.items():
    cfg = dataclasses.replace(saved, mesh=spec)
    setup = loop.build(cfg, 300, loop.make_mesh(cfg))
    state, _ = ckpt.restore(setup.abstract_state, 2)
    leaves = jax.tree.leaves(state)
    np.savez(out / f"restored_{name}.npz", *[np.asarray(x) for x in leaves])
    q = state.params["layers"]["q"]  # stacked over the layers (the layer axis unsharded)
    result["restored"][name] = {
      "devices": len(q.sharding.device_set),
      "q_spec": str(q.sharding.spec),
      "step": int(state.step),
      "leaves": len(leaves),
    }
  ckpt.close()
  result["imported"] = _imported_on_a_mesh(out, first_mesh)
  (out / "result.json").write_text(json.dumps(result))


def _imported_on_a_mesh(out: pathlib.Path, mesh_spec: str) -> dict:
  """The --init-from parameters of the Llama fixture as a run on `mesh_spec` places them (saved to npz)."""
  from s3r import model as s3r_model
  from s3r.train import builder, loop
  from s3r.train.config import TrainConfig

  llama = pathlib.Path(__file__).parents[1] / "model" / "fixtures_hf" / "llama"
  cfg = TrainConfig(out=str(out / "imported"), init_from=str(llama), mesh=mesh_spec, batch=8, seq=32)
  setup = loop.build(cfg, s3r_model.load_hf_tokenizer(llama).vocab_size, loop.make_mesh(cfg))
  params = builder.imported_params(cfg, jax.tree.map(lambda a: a.sharding, setup.abstract_state.params))
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  arrays: dict[str, Any] = {jax.tree_util.keystr(k): np.asarray(x) for k, x in flat}
  np.savez(out / "imported.npz", **arrays)
  q = params["layers"]["q"]  # stacked over the layers (the layer axis unsharded)
  return {
    "q_spec": str(q.sharding.spec),
    "q_devices": len(q.sharding.device_set),
    "q_shard": list(q.addressable_shards[0].data.shape[1:]),
  }


def comm_worker(out: pathlib.Path) -> None:
  """`python -m benchmarks comm` on `tiny` (2 layers, batch 128 > the unrolled-update limit of 64)
  on a data x fsdp mesh, for s3r and s3r_ec, every collective listed."""
  import sys

  from benchmarks import cli

  argv = [
    "comm",
    "--preset",
    "tiny",
    "--layers",
    "2",
    "--batch",
    "128",
    "--seq",
    "16",
    "--meshes",
    "data=2,fsdp=4",
    "--recipes",
    "s3r,s3r_ec",
    "--out",
    str(out / "comm"),
    "--list-min-kib",
    "0",
  ]
  sys.argv = ["python -m benchmarks", *argv]  # the command the results file records
  cli.main(argv)
  (out / "result.json").write_text((out / "comm.json").read_text())


MOE_MESHES = (None, "expert=8", "expert=2,data=4")  # expert=4,data=2: the all_to_all tests
A2A_MESHES = ("expert=8", "expert=4,data=2")
MOE_RECIPES = ("s3r", "s3r_ec_dx")


def _moe_block(recipe: str, expert_dispatch: str):
  """The MoE layer of the MoE tests: 8 experts, top-2, one shared expert, width 32."""
  from flax import nnx

  from s3r.model.moe import MoEFeedForward
  from s3r.model.moe_settings import MoeSettings

  settings = MoeSettings(d_model=32, d_expert=24, n_experts=8, top_k=2, n_shared=1, expert_dispatch=expert_dispatch)
  return MoEFeedForward(settings, recipe=recipe, rngs=nnx.Rngs(params=0))


def _moe_layer_runs(out: pathlib.Path, prefix: str, blocks: dict, runs) -> None:
  """One MoE layer per entry of `blocks` (name: (build the layer, input dtype)): its output, load-balancing
  loss, dropped fraction and gradients (parameters and input) for each (name, mesh spec or None,
  key seed) of `runs`, traced as `s3r train` traces it (tokens over (data, expert), expert weights
  over expert, activations constrained). Writes <prefix>_<block>_<name>.npz and, per sharded
  run, the compiled gradient program's collectives by kind, the all_to_alls of its jaxpr and the
  gate expert weight's sharding into result.json."""
  from flax import nnx

  from labtools.analysis.collectives import collectives
  from s3r.train.step import sharding

  rng = np.random.default_rng(0)
  x_f32 = rng.normal(size=(8, 16, 32)) * rng.uniform(0.2, 2, size=(8, 16, 1))
  g = jnp.asarray(rng.normal(size=(8, 16, 32)), jnp.float32)
  info: dict[str, Any] = {}
  for recipe, (make_block, x_dtype) in blocks.items():
    x = jnp.asarray(x_f32, x_dtype)
    graphdef, state = nnx.split(make_block())
    axes = jax.tree.map(
      lambda v: P(*v.get_metadata()["logical_axes"]), state, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    params, axes = nnx.to_pure_dict(state), nnx.to_pure_dict(axes)

    def forward(params, x, key):
      y, aux = nnx.merge(graphdef, params)(x, key)
      return y.astype(jnp.float32), aux

    def loss(params, x, key):
      y, aux = forward(params, x, key)
      return jnp.sum(y * g) + aux["load_balance_loss"]

    grad = jax.grad(loss, argnums=(0, 1))
    for name, mesh_spec, seed in runs:
      key = jax.random.key(seed)
      if mesh_spec is None:
        (dp, dx), (y, aux) = jax.jit(grad)(params, x, key), jax.jit(forward)(params, x, key)
      else:
        mesh = sharding.make_mesh(sharding.parse_mesh(mesh_spec, 8))
        p_sh = jax.tree.map(
          lambda spec, a: sharding.sharding(mesh, spec, a.shape), axes, params, is_leaf=lambda s: isinstance(s, P)
        )
        x_sh = sharding.sharding(mesh, P("batch", "seq", None), x.shape)
        in_sh = (p_sh, x_sh, NamedSharding(mesh, P()))
        traced = lambda f: sharding.with_activation_sharding(f, mesh)
        fn = jax.jit(traced(grad), in_shardings=in_sh, out_shardings=(p_sh, x_sh))
        compiled = fn.lower(params, x, key).compile()
        kinds = [c.kind for c in collectives(hlo_text(compiled))]
        info[f"{recipe}_{name}_collectives"] = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
        jaxpr = str(jax.make_jaxpr(traced(grad))(params, x, key))
        info[f"{recipe}_{name}_jaxpr_all_to_all"] = jaxpr.count("all_to_all")
        info[f"{recipe}_{name}_gate_spec"] = str(p_sh["gate"].spec)
        args = (jax.device_put(params, p_sh), jax.device_put(x, x_sh), key)
        dp, dx = compiled(*args)
        y, aux = jax.jit(traced(forward), in_shardings=in_sh)(*args)
      arrays: dict[str, Any] = {f"d_{k}": np.asarray(v) for k, v in dp.items()}
      arrays["dx"] = np.asarray(dx.astype(jnp.float32))
      arrays |= {"y": np.asarray(y), "load_balance_loss": np.asarray(aux["load_balance_loss"])}
      arrays["dropped_fraction"] = np.asarray(aux["dropped_fraction"])
      np.savez(out / f"{prefix}_{recipe}_{name}.npz", **arrays)
  (out / "result.json").write_text(json.dumps(info))


def moe_worker(out: pathlib.Path, *recipes: str) -> None:
  """The MoE layer with the default (gspmd) dispatch on one device and on expert x data meshes,
  plus a one-device run with another key (the size of the rounding noise): moe_*.npz, for each of
  `recipes` (default MOE_RECIPES)."""
  runs = [(spec or "1", spec, 10) for spec in MOE_MESHES] + [("1:other_key", None, 11)]
  blocks = {r: (functools.partial(_moe_block, r, "gspmd"), jnp.bfloat16) for r in recipes or MOE_RECIPES}
  _moe_layer_runs(out, "moe", blocks, runs)


def moe_a2a_worker(out: pathlib.Path) -> None:
  """The MoE layer with expert_dispatch="all_to_all" on one device (the one-program formulation)
  and, traced under each mesh, by all_to_all: moe_a2a_*.npz."""
  runs = [("1", None, 10)] + [(spec, spec, 10) for spec in A2A_MESHES]
  blocks = {recipe: (functools.partial(_moe_block, recipe, "all_to_all"), jnp.bfloat16) for recipe in MOE_RECIPES}
  _moe_layer_runs(out, "moe_a2a", blocks, runs)


def moe_a2a_act_dtype_worker(out: pathlib.Path) -> None:
  """The MoE feed-forward of a Qwen3-MoE config with the unquantized recipe and expert_dispatch="all_to_all",
  with act_dtype float32 and bfloat16 (its input in that dtype), on one device and by all_to_all under
  expert=4 x data=2: moe_a2a_dtype_<act_dtype>_*.npz."""
  from s3r.model import Qwen3MoeConfig
  from s3r.model.blocks import moe_feed_forward

  shape = dict(d_model=32, n_heads=4, n_kv_heads=2, d_expert=24, n_experts=8, top_k=2, n_shared=1)
  config = lambda dtype: Qwen3MoeConfig(**shape, recipe="bf16", expert_dispatch="all_to_all", act_dtype=dtype)
  blocks = {
    dtype: (lambda dtype=dtype: moe_feed_forward(config(dtype), jax.random.key(0)), jnp.dtype(dtype))
    for dtype in ("float32", "bfloat16")
  }
  _moe_layer_runs(out, "moe_a2a_dtype", blocks, [("1", None, 10), ("expert=4,data=2", "expert=4,data=2", 10)])


WORKERS = {
  "explicit_ops": explicit_ops_worker,
  "explicit_minigpt": explicit_minigpt_worker,
  "moe": moe_worker,
  "moe_a2a": moe_a2a_worker,
  "moe_a2a_act_dtype": moe_a2a_act_dtype_worker,
  "comm": comm_worker,
  "qmatmul": qmatmul_worker,
  "tp": tp_worker,
  "train": train_worker,
  "checkpoint": checkpoint_worker,
}

if __name__ == "__main__":
  WORKERS[sys.argv[1]](pathlib.Path(sys.argv[2]), *sys.argv[3:])
