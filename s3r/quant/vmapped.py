"""`qmatmul` under `jax.vmap`: the mapped calls become one batched call.

Without a rule, `jax.vmap(lambda x: qmatmul(x, w, key=key))(x_VxSxK)` batches qmatmul's internals
index by index: a step Δ per mapped index, the same thresholds for every index (one key), and in
the backward a dW per index, [V, K, N] in f32, that vmap then sums. With the rule the V calls run
as the one call `qmatmul(x_VxSxK, w, key=key)` on the stacked operand: one forward GEMM, one dX and
one dW GEMM over all V·S tokens, the per-tensor step Δ of the whole batch, per-token thresholds
drawn once for all of it, and no per-index weight-sized temporary.

*Example*, then, is read from the stacked operand as for any qmatmul call (see matmul.py): the
mapped axis is put first, so a call on x [S, K] mapped V times is V examples of S tokens (the
Equinox idiom `jax.vmap(model)(x_BxSxK)`), a call on one token x [K] mapped V times is one
example of V tokens (a vmap over the tokens of one example, as Equinox layers do inside a
model), and x [B, S, K] mapped V times is V examples of B·S tokens. The S3R-EC means and the
`_bcast` recipes' per-example thresholds are taken over those examples; per-token thresholds and
the forward's per-token scales do not depend on it.

The rule applies when x is mapped and w and the key are not (one weight, one key: the
per-example application of a model). With a mapped weight (a vmap over layers or experts) the
calls are independent matmuls, as without the rule, except that an unmapped key is split into
one key per index; a mapped key (keys chosen per index) keeps the per-index calls as well.

How: `jax.custom_batching.custom_vmap`, bound only where vmap's trace is the innermost
transformation of the call. custom_vmap cannot be differentiated in reverse mode (JAX linearizes
it into an operation without a transpose rule), so it must never be seen by `grad`: under
`jax.grad(lambda w: loss(jax.vmap(f)(x, w)))` vmap is applied first and the rule replaces the
vmapped call by the batched qmatmul, whose custom VJP grad then differentiates; under
`jax.vmap(jax.grad(...))` (per-example gradients) grad is innermost and the per-index calls stay,
as their semantics require. A vmap applied to a program already staged (a `jax.jit`, `lax.scan`,
`jax.checkpoint` or `lax.cond` body traced inside the vmapped function) batches that program's
equations and does not reach the rule: the per-index behaviour. Finding the innermost
transformation reads JAX's trace state (`jax.extend.core.find_top_trace` and vmap's trace class).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax._src.interpreters import batching as _batching  # vmap's trace class: no public name
from jax.extend import core

Body = Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array]  # (x, w, key) -> y, for one call


def mapped(x: jax.Array, w: jax.Array, key: jax.Array | None) -> bool:
  """Whether the innermost transformation of this call is a vmap that maps one of x, w or the key."""
  trace = core.find_top_trace(())
  if not isinstance(trace, _batching.BatchTrace):
    return False
  leaves = [a for a in (x, w, key) if a is not None]
  return any(trace.to_batch_info(a)[1] is not None for a in leaves)


def call(body: Body, batched: Body, x: jax.Array, w: jax.Array, key: jax.Array | None) -> jax.Array:
  """body(x, w, key) for one call, with the batching rule above: under vmap, `batched` (the same
  product on the stacked operands) when only x is mapped, else `body` index by index."""
  fn = jax.custom_batching.custom_vmap(body)

  @fn.def_vmap
  def rule(axis_size: int, in_batched: list, x: jax.Array, w: jax.Array, key: jax.Array | None):
    x_mapped, w_mapped, key_mapped = in_batched
    if x_mapped and not w_mapped and not key_mapped:
      return batched(x, w, key), True  # the mapped axis is already x's first
    if key is not None and not key_mapped and w_mapped:
      key, key_mapped = jax.random.split(key, axis_size), True  # independent matmuls, one key each
    axes = [0 if m else None for m in (x_mapped, w_mapped, key_mapped)]
    return jax.vmap(body, in_axes=axes)(x, w, key), True

  return fn(x, w, key)
