"""Expert parallelism with an explicit token exchange: the routed experts of MoEFeedForward in a
`shard_map`, rows sent to their expert's device and back with `jax.lax.all_to_all`.

`MoEFeedForward(expert_dispatch="all_to_all")` runs its routed experts here when the trace has a
mesh (`jax.sharding.use_abstract_mesh`, as `s3r train` traces its step) whose token axes hold
more than one device; otherwise (one device) it runs the one-device formulation, which computes
the same. The router, the load-balancing loss and the shared experts stay outside, under XLA's
partitioner.

Layout. The tokens are sharded over TOKEN_AXES (the `batch` rule of s3r.train.step.sharding), n
devices in all, flat index d (row-major over the axes). The expert weights [E, ...] are sharded
over EXPERT_AXIS (E_loc = E / X experts per expert rank; replicated when X does not divide E).
Every expert gets one owner among the devices holding its weights: the devices of one expert
rank (its data x fsdp replicas) share its E_loc experts round-robin, so each expert's rows all
land on one device and the replicas of a weight receive its whole gradient from its owner and
zeros from the others (their f32 all-reduce adds exact zeros).

Exchange (dropless). Device d routes its T_loc tokens (A = T_loc·k assignments) and places each
assignment in a capacity-padded send buffer [n, A, D], one slice per destination (capacity A:
even all of d's assignments fit one destination, so nothing is dropped; unused slots are
padding). One all_to_all delivers to every device its rows from every device ([n·A] = T·k
rows, the one-device row count); it sorts them by their global row index (sent along), which
orders them by expert exactly as the one-device sort does, runs the gate/up/down grouped GEMMs
on its local experts (padding rows sort past the group sizes and give zero outputs and
gradients), and a second all_to_all returns the outputs to their tokens' devices for the
weighted combine, added per token in ascending expert order as on one device.

Numerics. The global row index of an assignment (its position in the one-device sort by
expert, then slot, then token) follows from an all_gather of each device's [k, E] routing
counts; grouped_qmatmul(rows=GlobalRows(...)) draws each row's threshold at that index and
takes the backward step Δ as a pmax over the token axes. With each expert's rows complete and
in one-device order on its owner, the S3R-EC segment statistics are local. So every quantized
gradient is the one-device one (tests/distributed/test_expert_parallel_a2a.py).

Dimension letters: T tokens (global), t local tokens, D model width, E experts (global),
L local experts, K top_k, A = t·K local assignments, n token devices, R = n·A received rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from s3r.model.layers import gated
from s3r.quant import grouped_qmatmul
from s3r.quant.grouped import GlobalRows

EXPERT_AXIS = "expert"  # mesh axis of the routed-expert dimension (s3r.train.step.sharding.RULES["expert"])
TOKEN_AXES = ("data", "expert", "fsdp")  # mesh axes of the token dimension (s3r.train.step.sharding.RULES["batch"])


def token_axes(mesh) -> tuple[str, ...]:
  """The TOKEN_AXES present in `mesh`, in order."""
  return tuple(a for a in TOKEN_AXES if a in mesh.axis_names)


def applies(mesh) -> bool:
  """Whether the all_to_all formulation runs under `mesh` (a mesh whose token axes hold > 1 device)."""
  return not mesh.empty and math.prod(mesh.shape[a] for a in token_axes(mesh)) > 1


def owners(n_experts: int, mesh) -> np.ndarray:
  """[E] flat token-device index of each expert's owner (see the module docstring)."""
  axes = token_axes(mesh)
  sizes = [mesh.shape[a] for a in axes]
  ranks = mesh.shape.get(EXPERT_AXIS, 1)
  ranks = ranks if n_experts % ranks == 0 else 1
  local = n_experts // ranks
  out = np.zeros(n_experts, np.int32)
  for e in range(n_experts):
    rank = e // local
    holders = [
      d for d, coords in enumerate(np.ndindex(*sizes)) if ranks == 1 or coords[axes.index(EXPERT_AXIS)] == rank
    ]
    out[e] = holders[(e % local) % len(holders)]
  return out


def routed_experts(
  x_TxD: jax.Array,
  expert_TxK: jax.Array,
  weight_TxK: jax.Array,
  weights: tuple[jax.Array, jax.Array, jax.Array],
  keys: tuple,
  *,
  act: Callable[[jax.Array], jax.Array],
  recipe,
  impl: str | None,
  mesh,
  compute_dtype=None,
) -> jax.Array:
  """Σ_k weight[t, k] · down(act(gate(x[t])) · up(x[t])) of expert[t, k], [T, D] f32, by all_to_all.

  `weights` are the gate, up, down expert weights [E, D, F], [E, D, F], [E, F, D]; `keys` their
  three typed keys (deterministic recipes ignore them); `mesh` the trace's (abstract) mesh; `compute_dtype` the
  unquantized recipe's operand dtype (s3r.grouped_qmatmul; None: bf16), as on one device.
  """
  t, _ = x_TxD.shape
  e = weights[0].shape[0]
  axes = token_axes(mesh)
  n = math.prod(mesh.shape[a] for a in axes)
  if t % n:
    raise ValueError(f"MoEFeedForward(expert_dispatch='all_to_all'): {t} tokens do not divide over {n} devices")
  ranks = mesh.shape.get(EXPERT_AXIS, 1)
  w_spec = P(EXPERT_AXIS) if ranks > 1 and e % ranks == 0 else P()
  local_experts = e // ranks if w_spec != P() else e
  keys = tuple(jax.random.key(0) if k is None else k for k in keys)
  body = _Body(
    axes=axes,
    n=n,
    experts=e,
    local_experts=local_experts,
    owner=owners(e, mesh),
    rows=t * expert_TxK.shape[1],
    act=act,
    recipe=recipe,
    impl=impl,
    compute_dtype=compute_dtype,
    sharded_weights=w_spec != P(),
  )
  tok = P(axes)
  # check_vma=False: the grouped GEMMs' loop carries are not annotated per mesh axis. The weights'
  # gradients are then summed over the axes their spec leaves out (data, fsdp): owner + zeros.
  fn = jax.shard_map(
    body, mesh=mesh, in_specs=(tok, tok, tok, (w_spec,) * 3, (P(),) * 3), out_specs=tok, check_vma=False
  )
  return fn(x_TxD, expert_TxK.astype(jnp.int32), weight_TxK, tuple(weights), keys)


class _Body:
  """The per-device program (static configuration as attributes)."""

  def __init__(
    self, *, axes, n, experts, local_experts, owner, rows, act, recipe, impl, compute_dtype, sharded_weights
  ):
    self.axes, self.n, self.experts, self.local_experts = axes, n, experts, local_experts
    self.owner, self.rows, self.act, self.recipe, self.impl = owner, rows, act, recipe, impl
    self.compute_dtype = compute_dtype
    self.sharded_weights = sharded_weights

  def global_rows(self, expert_A, slot_A, k):
    """Each local assignment's position in the one-device expert-sorted rows (sorted by expert,
    then slot, then global token), [A] int32."""
    e = self.experts
    count_KxE = jnp.zeros((k, e), jnp.int32).at[slot_A, expert_A].add(1)
    all_NxKxE = lax.all_gather(count_KxE, self.axes)
    total_E = jnp.sum(all_NxKxE, axis=(0, 1))
    by_slot_KxE = jnp.sum(all_NxKxE, axis=0)
    me = lax.axis_index(self.axes)
    earlier_KxE = jnp.sum(jnp.where((jnp.arange(self.n) < me)[:, None, None], all_NxKxE, 0), axis=0)
    base_KxE = (jnp.cumsum(total_E) - total_E)[None, :] + (jnp.cumsum(by_slot_KxE, axis=0) - by_slot_KxE) + earlier_KxE
    group_A = expert_A * k + slot_A  # local (expert, slot) groups; the local tokens are ascending inside each
    size_G = jnp.bincount(group_A, length=e * k)
    within_A = jnp.arange(group_A.shape[0], dtype=jnp.int32) - (jnp.cumsum(size_G) - size_G)[group_A]
    return base_KxE[slot_A, expert_A] + within_A

  def __call__(self, x_txD, expert_txK, weight_txK, weights, keys):
    t, d = x_txD.shape
    k = expert_txK.shape[1]
    a, n, e, lo = t * k, self.n, self.experts, self.local_experts
    # Local assignments in (expert, slot, token) order: the order of the one-device rows
    expert_A0 = expert_txK.T.reshape(-1)
    slot_A0 = jnp.repeat(jnp.arange(k, dtype=jnp.int32), t)
    order = jnp.argsort(expert_A0 * k + slot_A0, stable=True)
    expert_A, slot_A = expert_A0[order], slot_A0[order]
    token_A = jnp.tile(jnp.arange(t, dtype=jnp.int32), k)[order]
    weight_A = weight_txK.T.reshape(-1)[order]
    row_A = self.global_rows(expert_A, slot_A, k)

    # Send buffer slot of each assignment: destination-major, capacity a per destination
    dest_A = jnp.asarray(self.owner)[expert_A]
    size_N = jnp.bincount(dest_A, length=n)
    by_dest = jnp.argsort(dest_A, stable=True)
    rank_A = (
      jnp.zeros((a,), jnp.int32)
      .at[by_dest]
      .set(jnp.arange(a, dtype=jnp.int32) - (jnp.cumsum(size_N) - size_N)[dest_A[by_dest]])
    )
    slot_of_A = dest_A * a + rank_A
    meta_A = jnp.stack([row_A, expert_A], axis=1)
    send_x = jnp.zeros((n * a, d), x_txD.dtype).at[slot_of_A].set(x_txD[token_A])
    send_meta = jnp.tile(jnp.asarray([[self.rows, e]], jnp.int32), (n * a, 1)).at[slot_of_A].set(meta_A)
    exchange = lambda buf: lax.all_to_all(buf.reshape((n, a) + buf.shape[1:]), self.axes, 0, 0).reshape(buf.shape)
    recv_x, recv_meta = exchange(send_x), exchange(send_meta)

    # The received rows (R = n·a) in global row order: this device's experts' segments, then padding
    by_row = jnp.argsort(recv_meta[:, 0], stable=True)
    x_RxD, row_R, expert_R = recv_x[by_row], recv_meta[by_row, 0], recv_meta[by_row, 1]
    expert0 = lax.axis_index("expert") * lo if self.sharded_weights else jnp.int32(0)
    local_R = jnp.where(expert_R < e, expert_R - expert0, lo)
    group_sizes = jnp.bincount(local_R, length=lo + 1)[:lo].astype(jnp.int32)
    rows = GlobalRows(index=row_R, expert0=expert0, total=self.rows, experts=e, axes=self.axes)
    w_gate, w_up, w_down = weights

    def gq(h, w, key):
      return grouped_qmatmul(
        h, w, group_sizes, key=key, recipe=self.recipe, impl=self.impl, rows=rows, compute_dtype=self.compute_dtype
      )

    h_RxF = gated(self.act, gq(x_RxD, w_gate, keys[0]), gq(x_RxD, w_up, keys[1]))
    out_RxD = gq(h_RxF, w_down, keys[2])

    # Back to the sending devices, then the weighted combine in (expert, slot, token) order
    back = exchange(jnp.zeros_like(out_RxD).at[by_row].set(out_RxD))
    out_AxD = back[slot_of_A]
    return jnp.zeros((t, d), jnp.float32).at[token_A].add(out_AxD.astype(jnp.float32) * weight_A[:, None])
