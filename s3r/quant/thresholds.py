"""Stochastic-rounding thresholds: compact 7-bit draws and the threshold topologies.

Compact thresholds (docs/algorithm.md §1, "Compact thresholds"): one 32-bit Threefry word gives
four thresholds: each byte keeps its low 7 bits k in {0..127} and maps to u = (k + 1/2) / 128.
The half-step shift makes the rounding bias |E[floor(p + u)] - p| at most 1/256 for every
residual p in [0, 1).

A `Topology` says which elements of the scaled gradient share one threshold: none (`Independent`,
a full-size f32 uniform per element, the `int8_sr` recipe), every element of a token (`PerToken`,
"token") or of an example (`PerExample`, "example"). Each knows its draws for the dense layout
G' [B, S, N] and for the grouped layout (expert-sorted rows, `GroupedRows`), and how many random
32-bit words they take. `TOPOLOGIES` is the registry; a recipe names its topologies in it.

Dimension letters: B examples, S tokens per example, T rows, E experts, N channels.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar, NamedTuple

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


class GroupedRows(NamedTuple):
  """Where the rows of a grouped (expert-sorted) G' [T, N] sit in the product the draws are made for."""

  total: int  # rows of the whole product (per-row draws are made for this many rows)
  experts: int  # experts of the whole product (per-expert draws are made for this many)
  channels: int  # N
  at_row: Callable[[jax.Array], jax.Array]  # [total, ...] draws -> each local row's [T, ...]
  expert_T: jax.Array  # int32 [T]: each local row's expert index in the whole product


@dataclasses.dataclass(frozen=True)
class Topology(abc.ABC):
  """Which elements of G' share one stochastic-rounding threshold (hashable, stateless)."""

  name: ClassVar[str]  # registry name: what a recipe's dx_topology / dw_topology says
  shared: ClassVar[bool]  # compact 7-bit thresholds shared by several elements (S3R), or one uniform each

  @abc.abstractmethod
  def words(self, batch: int, seq: int, channels: int) -> int:
    """Random 32-bit words drawn for G' [batch, seq, channels] (dense)."""

  @abc.abstractmethod
  def dense(self, key: jax.Array, shape_BxSxN: tuple[int, int, int]) -> jax.Array:
    """Thresholds broadcastable against G' [B, S, N]."""

  @abc.abstractmethod
  def grouped(self, key: jax.Array, rows: GroupedRows) -> jax.Array:
    """Thresholds broadcastable against the grouped G' [T, N] (`rows` says where they sit)."""


@dataclasses.dataclass(frozen=True)
class Independent(Topology):
  """One f32 uniform per element (independent stochastic rounding)."""

  name: ClassVar[str] = "independent"
  shared: ClassVar[bool] = False

  def words(self, batch: int, seq: int, channels: int) -> int:
    return batch * seq * channels

  def dense(self, key: jax.Array, shape_BxSxN: tuple[int, int, int]) -> jax.Array:
    return jax.random.uniform(key, shape_BxSxN)

  def grouped(self, key: jax.Array, rows: GroupedRows) -> jax.Array:
    """[T, N]: the dense draws of the rows as one example of `rows.total` tokens."""
    return rows.at_row(jax.random.uniform(key, (1, rows.total, rows.channels))[0])


@dataclasses.dataclass(frozen=True)
class PerToken(Topology):
  """One compact threshold per token (a row of N channels): S3R's Φ2D."""

  name: ClassVar[str] = "token"
  shared: ClassVar[bool] = True

  def words(self, batch: int, seq: int, channels: int) -> int:
    return words_needed(batch * seq)

  def dense(self, key: jax.Array, shape_BxSxN: tuple[int, int, int]) -> jax.Array:
    """[B, S, 1]: only these B*S values are stored; the broadcast happens in the quantizer fusion."""
    batch, seq, _ = shape_BxSxN
    return compact_uniform(key, batch * seq).reshape(batch, seq, 1)

  def grouped(self, key: jax.Array, rows: GroupedRows) -> jax.Array:
    """[T, 1]: one per row (a token's copy for one expert), drawn by its index in the whole product."""
    return rows.at_row(compact_uniform(key, rows.total).reshape(rows.total, 1))


@dataclasses.dataclass(frozen=True)
class PerExample(Topology):
  """One compact threshold per example (S3R's Φbcast); in the grouped layout one per expert segment."""

  name: ClassVar[str] = "example"
  shared: ClassVar[bool] = True

  def words(self, batch: int, seq: int, channels: int) -> int:
    return words_needed(batch)

  def dense(self, key: jax.Array, shape_BxSxN: tuple[int, int, int]) -> jax.Array:
    """[B, 1, 1]."""
    return compact_uniform(key, shape_BxSxN[0]).reshape(-1, 1, 1)

  def grouped(self, key: jax.Array, rows: GroupedRows) -> jax.Array:
    """[T, 1]: each row its expert's threshold u[e(t)] (the segment plays the example's role)."""
    return compact_uniform(key, rows.experts)[rows.expert_T][:, None]


TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (Independent(), PerToken(), PerExample())}


def shared_topologies() -> tuple[str, ...]:
  """The registered topologies with shared thresholds: what a "shared" recipe may name."""
  return tuple(name for name, t in TOPOLOGIES.items() if t.shared)


def get_topology(name: str) -> Topology:
  """The registered topology called `name`."""
  try:
    return TOPOLOGIES[name]
  except (KeyError, TypeError):
    raise ValueError(f"threshold topology must be one of {tuple(TOPOLOGIES)}, got {name!r}") from None


def shared_thresholds(key: jax.Array, batch: int, seq: int, topology: str) -> jax.Array:
  """Thresholds broadcastable against G' [B, S, N]: [B, S, 1] per token, [B, 1, 1] per example."""
  topo = get_topology(topology)
  if not topo.shared:
    raise ValueError(f"topology must be one of {shared_topologies()}, got {topology!r}")
  return topo.dense(key, (batch, seq, 1))
