"""The lockstep run's train-step configuration (`research/lockstep.py` runs it; `python -m benchmarks aot
--program lockstep` compiles the same step for a GPU target): the model config of one recipe and the
optimizer at a unit rate, the learning rate being a runtime argument of the step."""

from __future__ import annotations

import dataclasses

from s3r import model as s3r_model
from s3r.train.step.optimizer import OptimizerConfig


def unit_rate(opt: OptimizerConfig) -> OptimizerConfig:
  """The optimizer at a constant rate of 1: its updates times lr(step) are those of `opt` at that step
  (AdamW's last transformation multiplies by the rate, so the rate can be a runtime argument)."""
  return dataclasses.replace(opt, lr=1.0, warmup_steps=0, final_lr_ratio=1.0)


def model_config(preset: str, recipe: str, vocab_size: int, seq: int, attention: str, tp_partial_sums: str, **over):
  """The lockstep run's model config of one recipe (`over`: further preset overrides, e.g. layers=1)."""
  base = s3r_model.PRESETS[preset]
  return s3r_model.preset(
    preset,
    vocab_size=vocab_size,
    recipe=recipe,
    max_seq_len=max(base.max_seq_len, seq),
    attention_impl=attention,
    tp_partial_sums=tp_partial_sums,
    **over,
  )


def one_device_mesh(device):
  """A mesh of one device: the lockstep step is lowered on it, on a GPU and for a compile-only GPU alike."""
  import numpy as np
  from jax.sharding import Mesh

  return Mesh(np.asarray([device]), ("device",))


def lower_train_step(mcfg, tx, mesh, batch: int, seq: int):
  """The lockstep train step, (state, tokens [B, S + 1], key, lr) -> (state, metrics) with the state
  donated, lowered from abstract arguments replicated on `mesh`. The lowering is the same text whether
  the mesh's device is a real GPU or a compile-only one, which lets a program compiled ahead of time be
  matched to the device's own lowering (`labtools.executables`)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from s3r import model as s3r_model
  from s3r.train.step import init_state, make_train_step

  replicated = NamedSharding(mesh, P())
  array = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  shapes = jax.eval_shape(lambda k: init_state(s3r_model.init_params(mcfg, k), tx), jax.random.key(0))
  state = jax.tree.map(lambda x: array(x.shape, x.dtype), shapes)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
  step = jax.jit(make_train_step(s3r_model.graphdef(mcfg), tx, lr_schedule=None), donate_argnums=0)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return step.lower(state, array((batch, seq + 1), np.int32), key, array((), np.float32))
