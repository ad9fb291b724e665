"""Pure train and eval steps (this module), with what they are built from beside them: the optimizer
(`optimizer.py`) and the device mesh with its partition rules (`sharding.py`).

Dimension letters: B batch, S sequence, V vocabulary. A batch is int32 [B, S + 1]:
inputs are its first S tokens, targets its last S.

MoE models (families with a routed feed-forward): the training loss is the cross-entropy plus
the load-balancing loss summed over the MoE layers (already weighted by the config's
`aux_loss_weight`); the step's metrics add `load_balance_loss` and `dropped_fraction` (the mean
over the MoE layers of the share of token-expert assignments dropped by the capacity). `loss`
stays the cross-entropy, and the eval step is the pure cross-entropy.

Randomness: the quantizers of step t use `fold_in(train_key, t)`, so a resumed run draws
exactly the numbers an uninterrupted run would; the model derives per-layer and
per-projection keys from it.

Gradient accumulation (`grad_accum=N > 1`): the global batch [B, S + 1] is split into N microbatches
of B / N rows (microbatch m holds rows m, m + N, m + 2N, ..., so each device's rows of the batch
split evenly over the microbatches and no row moves between devices), and a `lax.scan` over them
sums their f32 gradients: only one microbatch's activations exist at a time. Microbatch m draws
its quantizer noise from `microbatch_keys(step_key, N)[m]` = fold_in(fold_in(step_key,
purpose "microbatch"), m), so no two microbatches of a run share a key. The loss, the gradients
and the metrics are the means over the microbatches (every microbatch has the same number of
tokens, so the mean of their token means is the token mean of the batch). With N = 1 the step is
the plain one (no scan, the step key itself).
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import optax

from s3r import model as s3r_model


class TrainState(NamedTuple):
  """What a train step updates: the step count, the master weights and the optimizer state."""

  step: jax.Array  # int32 scalar: number of updates applied so far
  params: dict  # nested dict of f32 master weights
  opt_state: Any  # optax state of `make_optimizer`


def init_state(params: dict, tx: optax.GradientTransformation) -> TrainState:
  """A fresh TrainState (step 0) around the parameters from `s3r.model.init`."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def cross_entropy(logits_BxSxV: jax.Array, targets_BxS: jax.Array) -> jax.Array:
  """Token-mean cross-entropy, computed in f32."""
  losses_BxS = optax.softmax_cross_entropy_with_integer_labels(logits_BxSxV.astype(jnp.float32), targets_BxS)
  return jnp.mean(losses_BxS)


def loss_fn(params: dict, graphdef, batch_BxS1: jax.Array, key: jax.Array | None) -> jax.Array:
  """Token-mean cross-entropy of the next-token predictions (validation: no auxiliary terms)."""
  logits_BxSxV = s3r_model.apply(graphdef, params, batch_BxS1[:, :-1], key=key)
  return cross_entropy(logits_BxSxV, batch_BxS1[:, 1:])


def training_loss_fn(params: dict, graphdef, batch_BxS1: jax.Array, key: jax.Array | None):
  """(cross-entropy + MoE load-balancing loss, (cross-entropy, MoE auxiliary terms)); the auxiliary
  dict is empty for a dense model, whose training loss is the cross-entropy alone."""
  logits_BxSxV, aux = s3r_model.apply_with_aux(graphdef, params, batch_BxS1[:, :-1], key=key)
  ce = cross_entropy(logits_BxSxV, batch_BxS1[:, 1:])
  total = ce + aux["load_balance_loss"] if aux else ce
  return total, (ce, aux)


KEY_PURPOSES = ("microbatch",)  # fold_in data of the step key's uses under gradient accumulation


def microbatch_keys(step_key: jax.Array, n: int) -> jax.Array:
  """The keys of the `n` microbatches of one step, [n]: fold_in(fold_in(step_key, purpose "microbatch"), m)."""
  purpose_key = jax.random.fold_in(step_key, KEY_PURPOSES.index("microbatch"))
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(purpose_key, jnp.arange(n, dtype=jnp.uint32))


def microbatches(batch_BxS1: jax.Array, n: int) -> jax.Array:
  """[B, S + 1] as [n, B / n, S + 1]: microbatch m holds rows m, m + n, m + 2n, ... (each device's block of
  rows splits evenly over the microbatches, so the split moves no data between devices)."""
  b, s1 = batch_BxS1.shape
  micro_NxMxS1 = batch_BxS1.reshape(b // n, n, s1).swapaxes(0, 1)
  return s3r_model.constrain(micro_NxMxS1, (None, "batch", "seq"))


def accumulated_grads(params: dict, graphdef, batch_BxS1: jax.Array, step_key: jax.Array, n: int):
  """(mean cross-entropy, mean auxiliary terms, mean f32 gradients) over the `n` microbatches of the batch,
  one microbatch at a time (`lax.scan`), each with its own key (`microbatch_keys`)."""
  grad_fn = jax.value_and_grad(training_loss_fn, has_aux=True)
  micro_NxMxS1, keys = microbatches(batch_BxS1, n), microbatch_keys(step_key, n)
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  aux_shapes = jax.eval_shape(
    lambda p, x, k: training_loss_fn(p, graphdef, x, k)[1][1], params, micro_NxMxS1[0], keys[0]
  )
  aux_zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), aux_shapes)

  def body(carry, xs):
    grads_sum, loss_sum, aux_sum = carry
    micro_MxS1, key = xs
    (_, (loss, aux)), grads = grad_fn(params, graphdef, micro_MxS1, key)
    grads_sum = jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), grads_sum, grads)
    aux_sum = jax.tree.map(lambda acc, a: acc + a.astype(jnp.float32), aux_sum, aux)
    return (grads_sum, loss_sum + loss, aux_sum), None

  (grads_sum, loss_sum, aux_sum), _ = jax.lax.scan(body, (zeros, jnp.float32(0), aux_zeros), (micro_NxMxS1, keys))
  mean = lambda x: x / n
  grads = jax.tree.map(lambda g, p: mean(g).astype(p.dtype), grads_sum, params)
  return mean(loss_sum), jax.tree.map(mean, aux_sum), grads


FIRST_NONFINITE_GRAD = "first_nonfinite_grad"  # a metric the loop reads and never logs (see `first_nonfinite`)


def first_nonfinite(grads: dict) -> jax.Array:
  """int32: the index (in `jax.tree.leaves` order) of the first gradient leaf whose sum of squares is not
  finite (a NaN or an Inf in it, or an overflow of its norm), -1 if there is none.

  The sums of squares are those `optax.tree.norm` takes for the gradient norm: XLA computes each
  once for both (no extra pass over the gradients).
  """
  leaves = jax.tree.leaves(grads)
  if not leaves:
    return jnp.int32(-1)
  bad = jnp.stack([~jnp.isfinite(jnp.sum(jnp.square(g.real) + jnp.square(g.imag))) for g in leaves])  # as optax
  return jnp.where(jnp.any(bad), jnp.argmax(bad), -1).astype(jnp.int32)


def make_train_step(
  graphdef, tx: optax.GradientTransformation, lr_schedule: optax.Schedule | None, *, grad_accum: int = 1
):
  """Returns train_step(state, batch_BxS1, train_key) -> (new state, metrics): loss (the cross-entropy),
  grad_norm, first_nonfinite_grad (see `first_nonfinite`), lr, and for MoE models load_balance_loss
  and dropped_fraction. `grad_accum` > 1 accumulates the gradients of that many microbatches of the
  batch (`accumulated_grads`; the batch size must be a multiple of it).

  With `lr_schedule=None` the learning rate is an argument instead, train_step(state, batch_BxS1,
  train_key, lr), and the updates of `tx` (built at a constant rate of 1) are multiplied by it: the
  schedule can then be chosen after the step is compiled."""
  if not isinstance(grad_accum, int) or grad_accum < 1:
    raise ValueError(f"grad_accum must be an integer >= 1, got {grad_accum!r}")

  def train_step(state: TrainState, batch_BxS1: jax.Array, train_key: jax.Array, lr: jax.Array | None = None):
    step_key = jax.random.fold_in(train_key, state.step)
    if grad_accum == 1:
      grad_fn = jax.value_and_grad(training_loss_fn, has_aux=True)
      (_, (loss, aux)), grads = grad_fn(state.params, graphdef, batch_BxS1, step_key)
    else:
      loss, aux, grads = accumulated_grads(state.params, graphdef, batch_BxS1, step_key, grad_accum)
    with jax.named_scope("optimizer"):  # names its kernels in profiles and the performance model
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      if lr_schedule is None:
        assert lr is not None  # a step without a schedule takes the rate as an argument
        updates = jax.tree.map(lambda u: u * lr.astype(u.dtype), updates)
      params = cast(dict, optax.apply_updates(state.params, updates))  # the tree of state.params
    rate = lr if lr_schedule is None else lr_schedule(state.step)
    metrics = {
      "loss": loss,
      "grad_norm": optax.tree.norm(grads),
      FIRST_NONFINITE_GRAD: first_nonfinite(grads),
      "lr": rate,
      **aux,
    }
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  if lr_schedule is None:
    return train_step
  return lambda state, batch_BxS1, train_key: train_step(state, batch_BxS1, train_key)


def make_eval_step(graphdef):
  """Returns eval_step(params, batch_BxS1, eval_key) -> token-mean loss (forward only)."""

  def eval_step(params: dict, batch_BxS1: jax.Array, eval_key: jax.Array):
    return loss_fn(params, graphdef, batch_BxS1, eval_key)

  return eval_step
