"""max |x| that never loses a non-finite element, whatever the shape or backend.

XLA's vectorized float max reductions (XLA:CPU's YNNPACK reductions at some shapes) may return the
largest finite element of a slice that holds a NaN, so `jnp.max(jnp.abs(x))` can hide it; an
integer code cannot hold a NaN either, so a scale taken from such a max would turn the NaN into a
finite code. `abs_max` adds sum(x · 0) to that max: 0 (exactly, so the max is unchanged bit for bit)
for a finite slice, NaN for one with a NaN or an Inf (Inf · 0 is NaN), and a sum, unlike a max,
never drops a NaN. The scale or step taken from it is then NaN, which makes every product rescaled
by it NaN (docs/algorithm.md, "Non-finite values").

Cost: the sum is a second reduction over x, which XLA:CPU fuses with the producer of x as it fuses
the max (no full-size buffer is written; tests/quant/test_structure.py) but runs as its own pass
that reads x again. A max that propagates NaN by itself (a select inside the reduction, or a max
over the f32 bit patterns as integers) is not taken by those fused reductions: XLA then writes a
full-size temporary, which costs more.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def abs_max(x: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """max |x| (f32) along `axis` (all axes for None); NaN for a slice holding a NaN or an Inf."""
  x = x.astype(jnp.float32)
  return jnp.max(jnp.abs(x), axis=axis) + jnp.sum(x * jnp.float32(0), axis=axis)
