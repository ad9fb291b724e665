"""max |x| that never loses a non-finite element, whatever the shape or backend.

XLA's vectorized max reductions (XLA:CPU at some shapes) may return the largest finite element
of a slice that holds a NaN, so `jnp.max(jnp.abs(x))` can hide it; an integer code cannot hold a
NaN either, so a scale taken from such a max would turn the NaN into a finite code. `abs_max`
maps NaN to +inf inside the same fusion as the reduction (no extra pass over x): a slice with a
NaN or an Inf gets max +inf, which every max reduction keeps, and the scale or step taken from it
is +inf, which makes every product rescaled by it non-finite (docs/algorithm.md, "Non-finite
values").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def abs_max(x: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """max |x| (f32) along `axis` (all axes for None); +inf for a slice holding a NaN or an Inf."""
  a = jnp.abs(x.astype(jnp.float32))
  return jnp.max(jnp.where(jnp.isnan(a), jnp.float32(jnp.inf), a), axis=axis)
