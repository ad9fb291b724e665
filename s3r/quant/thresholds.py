"""Compact 7-bit stochastic-rounding thresholds (docs/algorithm.md §1, "Compact thresholds").

One 32-bit Threefry word gives four thresholds: each byte keeps its low 7 bits k in
{0..127} and maps to u = (k + 1/2) / 128. The half-step shift makes the rounding bias
|E[floor(p + u)] - p| at most 1/256 for every residual p in [0, 1).

Dimension letters: B examples, S tokens per example.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

THRESHOLD_BITS = 7
LEVELS = 1 << THRESHOLD_BITS  # 128 threshold values
_BYTE_SHIFTS = (0, 8, 16, 24)


def threshold_values() -> jax.Array:
  """All 128 values u can take, (k + 0.5) / 128 for k = 0..127 (f32)."""
  return (jnp.arange(LEVELS, dtype=jnp.float32) + 0.5) / LEVELS


def words_needed(count: int) -> int:
  """32-bit words drawn for `count` thresholds: four per word."""
  return math.ceil(count / len(_BYTE_SHIFTS))


def compact_uniform(key: jax.Array, count: int) -> jax.Array:
  """`count` thresholds u in (0, 1) from ceil(count/4) random 32-bit words (f32 [count]).

  Uses `jax.random.bits`, which with `jax_threefry_partitionable` (the JAX default since 0.5)
  gives the same values whatever the device mesh.
  """
  words = jax.random.bits(key, (words_needed(count),), jnp.uint32)
  shifts = jnp.asarray(_BYTE_SHIFTS, jnp.uint32)
  k = (words[:, None] >> shifts) & jnp.uint32(LEVELS - 1)  # [words, 4]: byte j of word i -> index 4i+j
  k = k.reshape(-1)[:count]
  return (k.astype(jnp.float32) + 0.5) / LEVELS


def shared_thresholds(key: jax.Array, batch: int, seq: int, topology: str) -> jax.Array:
  """Thresholds broadcastable against G' [B, S, N]: [B, S, 1] per token, [B, 1, 1] per example.

  Only these B*S (or B) values are ever stored; the broadcast to [B, S, N] happens inside
  the quantizer fusion.
  """
  if topology == "token":
    return compact_uniform(key, batch * seq).reshape(batch, seq, 1)
  if topology == "example":
    return compact_uniform(key, batch).reshape(batch, 1, 1)
  raise ValueError(f"topology must be 'token' or 'example', got {topology!r}")
