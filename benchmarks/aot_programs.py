"""The programs `python -m benchmarks aot` compiles for a GPU or TPU target, each lowered from abstract arguments
(`jax.ShapeDtypeStruct` with a sharding on the target's compile-only devices, the PRNG key included) under
the target's abstract mesh, which gives Pallas kernels the target's compute capability."""

from __future__ import annotations

import argparse
import dataclasses

from labtools.results import log
from s3r.model.config import AttentionImpl


def _abstract(mesh):
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  replicated = NamedSharding(mesh, P())
  array = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
  return array, key


def lower_ffn(mesh, recipe: str, tokens: int, hidden: int, ffn_dim: int):
  """The FFN block fwd+bwd of `benchmarks.ffn` lowered for the target from abstract arguments."""
  import jax
  import jax.numpy as jnp

  from benchmarks import ffn

  array, key = _abstract(mesh)
  args = (
    array((tokens, hidden), jnp.bfloat16),
    array((hidden, ffn_dim), jnp.float32),
    array((hidden, ffn_dim), jnp.float32),
    array((ffn_dim, hidden), jnp.float32),
    array((tokens, hidden), jnp.bfloat16),
    key,
  )
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # the target's device kind for Pallas kernels
    return ffn.make_fwd_bwd(recipe).lower(*args)


def lower_moe(mesh, recipe: str, tokens: int, k: int, n: int, experts: int, impl: str):
  """grouped_qmatmul(x [T, K], w [E, K, N]) fwd+bwd lowered for the target, returning y, dX and dW (E equal
  groups given as an abstract argument, so no group size is a compile-time constant)."""
  import jax
  import jax.numpy as jnp

  from s3r import grouped_qmatmul

  def fwd_bwd(x, w, group_sizes, dy, key):
    f = lambda x, w: grouped_qmatmul(x, w, group_sizes, key=key, recipe=recipe, impl=None if impl == "auto" else impl)
    y, vjp = jax.vjp(f, x, w)
    return y, *vjp(dy)  # y returned: otherwise XLA drops the forward GEMM from the program

  array, key = _abstract(mesh)
  args = (
    array((tokens, k), jnp.bfloat16),
    array((experts, k, n), jnp.float32),
    array((experts,), jnp.int32),
    array((tokens, n), jnp.bfloat16),
    key,
  )
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return jax.jit(fwd_bwd).lower(*args)


def target_attention(mesh, args: argparse.Namespace, mcfg) -> AttentionImpl:
  """`--attention` for the model `mcfg`: auto is cuDNN's flash attention where its forward and backward compile
  for the target at the model's heads, head dim, window, batch and sequence (as `s3r.train.attention.resolve`
  decides on a GPU: cuDNN refuses head dims above 128), else XLA's (always on a TPU target)."""
  import jax
  import jax.numpy as jnp

  if args.attention != "auto":
    return args.attention
  if mesh.devices.flat[0].platform == "tpu":
    return "xla"
  array, _ = _abstract(mesh)
  q = array((args.batch, args.seq, mcfg.n_heads, mcfg.head_dim), jnp.bfloat16)
  kv = array((args.batch, args.seq, mcfg.n_kv_heads, mcfg.head_dim), jnp.bfloat16)
  window = (mcfg.sliding_window - 1, 0) if getattr(mcfg, "sliding_window", None) else None

  def loss(q, k, v):
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window, implementation="cudnn")
    return jnp.sum(y.astype(jnp.float32))

  try:
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
  except Exception as e:  # cuDNN refuses at trace or compile time
    log(f"[aot]   cuDNN attention refused ({(str(e).strip().splitlines() or [type(e).__name__])[0][:120]}); XLA's used")
    return "xla"
  return "cudnn"


def lower_step(mesh, recipe: str, preset: str, layers: int | None, args: argparse.Namespace, scan: bool = True):
  """The train step of `s3r train` (as `python -m benchmarks step` builds it) lowered for the target:
  the state, the batch and the key are abstract values on the target's shardings. `scan`: the decoder's
  blocks under one scan (`scan_layers`, the default) or an unrolled loop."""
  import jax
  import numpy as np

  from benchmarks import step
  from s3r.train import builder

  cfg = step.train_config(preset, recipe, args)
  impl = target_attention(mesh, args, step.model_config(preset, recipe, args, layers, "xla"))
  overrides = {**step.model_overrides(args, layers, impl), "scan_layers": scan}
  setup = builder.build(cfg, step.vocab_size(preset, args), mesh, **overrides)
  batch = jax.ShapeDtypeStruct(cfg.batch_shape, np.int32, sharding=setup.batch_sharding)
  _, key = _abstract(mesh)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # the target's device kind for Pallas kernels (MoE)
    lowered = setup.train_step.lower(setup.abstract_state, batch, key)
  return lowered, setup.model_cfg


def lower_lockstep(mesh, recipe: str, preset: str, layers: int, args: argparse.Namespace, scan: bool = True):
  """The lockstep runner's train step (`research/lockstep.py` lowers it with the same function,
  `labtools.lockstep.lower_train_step`) lowered for the target on a mesh of its first device: (state,
  tokens [B, S + 1], key, lr) -> (state, metrics), the state donated."""
  from labtools import lockstep
  from s3r import model as s3r_model
  from s3r.train.step.optimizer import OptimizerConfig, make_optimizer

  vocab = args.vocab or s3r_model.PRESETS[preset].vocab_size
  mcfg = lockstep.model_config(preset, recipe, vocab, args.seq, "xla", "bf16", layers=layers)
  mcfg = dataclasses.replace(mcfg, attention_impl=target_attention(mesh, args, mcfg), scan_layers=scan)
  tx = make_optimizer(lockstep.unit_rate(OptimizerConfig(total_steps=args.schedule_steps, warmup_steps=0)))
  return lockstep.lower_train_step(mcfg, tx, lockstep.one_device_mesh(mesh.devices.flat[0]), args.batch, args.seq)
