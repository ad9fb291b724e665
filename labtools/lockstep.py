"""The lockstep run's train-step configuration (`research/lockstep.py` runs it; `python -m benchmarks aot
--program lockstep` compiles the same step for a GPU target): the model config of one recipe and the
optimizer at a unit rate, the learning rate being a runtime argument of the step."""

from __future__ import annotations

import dataclasses

from s3r import model as s3r_model
from s3r.train.optimizer import OptimizerConfig


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
