"""AdamW on the f32 master weights: linear warm-up, cosine decay, global-norm clipping.

The schedule is indexed by the optimizer step t = 1, 2, ... (the update that produces step t): the
warm-up rises linearly to the peak over steps 1 .. warmup_steps, so step 1 already trains at
lr / warmup_steps (not at 0) and step warmup_steps at lr; the cosine then decays to
lr * final_lr_ratio at step total_steps. Without warm-up, step 1 trains at the peak.
Peaks lowered on `--resume` (`lr_changes`, e.g. after a divergence) scale the curve from their step on.

The optimizer is the same for every recipe (docs/algorithm.md §2): the recipe only changes
how the gradients are computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from s3r.model.stack import per_layer_ndim


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
  # (step, peak): from the update after `step` on, the curve is scaled to peak `peak` instead of `lr`
  lr_changes: tuple[tuple[int, float], ...] = ()

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
    steps = [step for step, _ in self.lr_changes]
    if steps != sorted(set(steps)) or any(not peak > 0 for _, peak in self.lr_changes):
      raise ValueError(f"OptimizerConfig.lr_changes must have increasing steps and peaks > 0, got {self.lr_changes!r}")


def schedule(cfg: OptimizerConfig) -> Callable[[ArrayLike], jax.Array]:
  """Learning rate of the update with optax count c, the one that produces step t = c + 1: lr * t / warmup_steps
  up to t = warmup_steps, then cosine from lr at step max(warmup_steps, 1) to lr * final_lr_ratio at
  total_steps; each of `lr_changes` scales the rest of the curve to its peak (see the module docstring)."""
  top = max(cfg.warmup_steps, 1)  # the step at the peak
  end = cfg.lr * cfg.final_lr_ratio

  def rate(count):
    step = jnp.asarray(count, jnp.float32) + 1
    progress = jnp.clip((step - top) / max(cfg.total_steps - top, 1), 0.0, 1.0)
    cosine = end + (cfg.lr - end) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
    lr = jnp.where(step <= cfg.warmup_steps, cfg.lr * step / top, cosine)
    for change, peak in cfg.lr_changes:  # a change at (resume) step s applies to steps s + 1, ... (counts >= s)
      lr = jnp.where(count >= change, lr * (peak / cfg.lr), lr)
    return lr

  return rate


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW (weight decay on parameters with >= 2 dims per layer: a
  stacked block parameter of s3r.model counts without its layer axis, so norm scales never decay)."""
  decay_mask = lambda params: jax.tree.map(lambda n: n >= 2, per_layer_ndim(params))
  return optax.chain(
    optax.clip_by_global_norm(cfg.clip_norm),
    optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask),
  )
