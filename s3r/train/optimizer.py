"""AdamW on the f32 master weights: linear warm-up, cosine decay, global-norm clipping.

The optimizer is the same for every recipe (docs/algorithm.md §2): the recipe only changes
how the gradients are computed.
"""

from __future__ import annotations

import dataclasses

import jax
import optax


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
  """AdamW hyper-parameters and the learning-rate schedule."""

  lr: float = 6e-4  # peak learning rate, reached at the end of the warm-up
  total_steps: int = 300  # length of the schedule (warm-up + cosine decay)
  warmup_steps: int = 30  # linear warm-up from 0 to `lr`
  final_lr_ratio: float = 0.1  # the cosine decays to lr * final_lr_ratio at total_steps
  b1: float = 0.9  # Adam first-moment decay
  b2: float = 0.95  # Adam second-moment decay
  eps: float = 1e-8  # Adam denominator epsilon
  weight_decay: float = 0.1  # decoupled weight decay, applied to matrices only (not norm scales)
  clip_norm: float = 1.0  # global gradient-norm clipping threshold

  def __post_init__(self):
    if not self.lr > 0:
      raise ValueError(f"OptimizerConfig.lr must be > 0, got {self.lr!r}")
    if not isinstance(self.total_steps, int) or self.total_steps < 1:
      raise ValueError(f"OptimizerConfig.total_steps must be an int >= 1, got {self.total_steps!r}")
    if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps <= self.total_steps:
      raise ValueError(
        f"OptimizerConfig.warmup_steps must be an int in [0, total_steps={self.total_steps}], got {self.warmup_steps!r}"
      )
    if not 0 <= self.final_lr_ratio <= 1:
      raise ValueError(f"OptimizerConfig.final_lr_ratio must be in [0, 1], got {self.final_lr_ratio!r}")
    for field in ("b1", "b2"):
      if not 0 <= getattr(self, field) < 1:
        raise ValueError(f"OptimizerConfig.{field} must be in [0, 1), got {getattr(self, field)!r}")
    for field in ("eps", "clip_norm"):
      if not getattr(self, field) > 0:
        raise ValueError(f"OptimizerConfig.{field} must be > 0, got {getattr(self, field)!r}")
    if not self.weight_decay >= 0:
      raise ValueError(f"OptimizerConfig.weight_decay must be >= 0, got {self.weight_decay!r}")


def schedule(cfg: OptimizerConfig) -> optax.Schedule:
  """Learning rate at each step: 0 -> lr linearly over warmup_steps, then cosine to lr * final_lr_ratio."""
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=cfg.lr,
    warmup_steps=cfg.warmup_steps,
    decay_steps=max(cfg.total_steps, cfg.warmup_steps + 1),
    end_value=cfg.lr * cfg.final_lr_ratio,
  )


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW (weight decay on parameters with >= 2 dims)."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
    optax.clip_by_global_norm(cfg.clip_norm),
    optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask),
  )
