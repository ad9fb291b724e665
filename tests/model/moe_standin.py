"""A minimal stand-in for `s3r.model.moe.MoEFeedForward` (same constructor and call), used by the
model tests to exercise the MoE families' wiring independently of the real block.

Routing: f32 router logits h W_r [T, E], softmax, top-k (optionally renormalized); every routed
expert is computed densely for every token (E is tiny here) and weighted; shared experts are one
SwiGLU of width n_shared * d_shared. Expert and shared projections are recipe `qmatmul`s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.quant import qmatmul


def _param(key, shape, axes):
  return nnx.Param(0.02 * jax.random.normal(key, shape, jnp.float32), logical_axes=axes)


class MoEFeedForward(nnx.Module):
  def __init__(self, *, d_model, d_expert, n_experts, top_k, n_shared=0, d_shared=None, renormalize=True,
               capacity_factor=None, aux_loss_weight=0.01, recipe, act="silu", rngs):
    d, f, e = d_model, d_expert, n_experts
    self.router = _param(rngs.params(), (d, e), ("embed", None))
    self.w_gate = _param(rngs.params(), (e, d, f), (None, "embed", "mlp"))
    self.w_up = _param(rngs.params(), (e, d, f), (None, "embed", "mlp"))
    self.w_down = _param(rngs.params(), (e, f, d), (None, "mlp", "embed"))
    if n_shared:
      fs = n_shared * d_shared
      self.shared_gate = _param(rngs.params(), (d, fs), ("embed", "mlp"))
      self.shared_up = _param(rngs.params(), (d, fs), ("embed", "mlp"))
      self.shared_down = _param(rngs.params(), (fs, d), ("mlp", "embed"))
    self.n_shared, self.top_k, self.renormalize, self.recipe = n_shared, top_k, renormalize, recipe
    self.aux_loss_weight = aux_loss_weight

  def _swiglu(self, x, gate, up, down, key, j):
    k = lambda i: None if key is None else jax.random.fold_in(key, 3 * j + i)
    hidden = jax.nn.silu(qmatmul(x, gate, key=k(0), recipe=self.recipe)) * qmatmul(x, up, key=k(1), recipe=self.recipe)
    return qmatmul(hidden, down, key=k(2), recipe=self.recipe)

  def __call__(self, x_BxSxD, key):
    e = self.router.shape[1]
    probs_BxSxE = jax.nn.softmax(jnp.dot(x_BxSxD.astype(jnp.float32), self.router[...]), axis=-1)
    top_BxSxK, idx_BxSxK = jax.lax.top_k(probs_BxSxE, self.top_k)
    if self.renormalize:
      top_BxSxK = top_BxSxK / jnp.sum(top_BxSxK, axis=-1, keepdims=True)
    weight_BxSxE = jnp.sum(jax.nn.one_hot(idx_BxSxK, e) * top_BxSxK[..., None], axis=-2)
    y = sum(weight_BxSxE[..., i:i + 1] * self._swiglu(x_BxSxD, self.w_gate[i], self.w_up[i], self.w_down[i], key, i)
            .astype(jnp.float32) for i in range(e))
    if self.n_shared:
      y = y + self._swiglu(x_BxSxD, self.shared_gate[...], self.shared_up[...], self.shared_down[...], key, e)
    fraction_E = jnp.mean(jax.nn.one_hot(idx_BxSxK, e).sum(-2), axis=(0, 1)) / self.top_k
    balance = self.aux_loss_weight * e * jnp.sum(fraction_E * jnp.mean(probs_BxSxE, axis=(0, 1)))
    return y.astype(x_BxSxD.dtype), {"load_balance_loss": balance, "dropped_fraction": jnp.zeros(())}
