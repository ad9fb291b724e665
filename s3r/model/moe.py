"""Mixture-of-experts SwiGLU feed-forward block whose expert GEMMs are INT8 `grouped_qmatmul`s.

Dimension letters in tensor names:
  B batch, S sequence, T = B*S tokens, D model width, E routed experts, F expert width,
  G shared-expert width, A = T*top_k token-expert assignments (the rows of the grouped GEMMs).

Routing: an f32 router (kept unquantized) gives softmax probabilities over the E experts; each
token takes its top_k experts, with the top-k weights optionally renormalized to sum to one,
then multiplied by `routed_scaling_factor` (DeepSeek; 1 by default). The A assignments are
sorted by expert (dropless: every assignment gets a row; with a capacity factor, each expert
keeps at most C = ceil(capacity_factor · A / E) rows, top-1 choices first, and the rest become
padding rows past sum(group_sizes), which give zero outputs and zero gradients). Gate, up and
down are grouped GEMMs with the recipe; the outputs are weighted and summed back to their tokens
in f32. Shared experts (always active) are one dense SwiGLU of width G through `qmatmul`. The
auxiliary load-balancing loss is the Switch/GShard one, E · Σ_e f_e P_e (f_e the fraction of
assignments routed to e, P_e the mean router probability of e), times `aux_loss_weight`.

Expert dispatch: "gspmd" (the default) writes the routed experts as one program over all tokens
and leaves any token exchange to XLA's SPMD partitioner; "all_to_all" (dropless only) runs them
in a `shard_map` with an explicit all_to_all exchange when the trace has a mesh (moe_ep.py).
Both give the same quantized gradients (docs/moe.md, "Expert parallelism").

Randomness: each GEMM's key is `fold_in(key, index of its purpose in PURPOSES)`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.model import moe_ep
from s3r.model.layers import folded_keys, gated, param
from s3r.model.moe_settings import MoeSettings
from s3r.quant import grouped_qmatmul, qmatmul
from s3r.quant import recipe as get_recipe

PURPOSES = ("gate", "up", "down", "shared_gate", "shared_up", "shared_down")  # index = fold_in data of each GEMM key
_ACTS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "relu": jax.nn.relu}


class MoEFeedForward(nnx.Module):
  """Top-k routed SwiGLU experts (+ optional shared experts) with INT8 grouped expert GEMMs."""

  def __init__(
    self,
    settings: MoeSettings,
    *,
    recipe,
    rngs: nnx.Rngs,
    init_std: float = 0.02,
    impl: str | None = None,
    compute_dtype=None,
  ):
    """`settings` (checked when built) gives the shape and routing; `recipe` the expert GEMMs' recipe, `impl` their
    grouped GEMM implementation (see s3r.grouped_qmatmul; None: the default), `compute_dtype` the bf16 recipe's
    operand dtype (s3r.qmatmul; None: bf16); the matrices are drawn from N(0, init_std^2) with `rngs`."""
    if not isinstance(settings, MoeSettings):
      raise TypeError(f"MoEFeedForward: settings must be a s3r.model.moe_settings.MoeSettings, got {settings!r}")
    self.settings = settings
    self.expert_dispatch = settings.expert_dispatch
    self.recipe = get_recipe(recipe)
    self.compute_dtype = compute_dtype
    self.impl = impl
    self.n_experts, self.top_k, self.renormalize = settings.n_experts, settings.top_k, settings.renormalize
    self.routed_scaling_factor = settings.routed_scaling_factor
    self.capacity_factor, self.aux_loss_weight = settings.capacity_factor, settings.aux_loss_weight
    self.act = settings.act
    k = jax.random.split(rngs.params(), 7)
    d, f, e = settings.d_model, settings.d_expert, settings.n_experts
    self.router = param(k[0], (d, e), init_std, ("embed", None))
    self.gate = param(k[1], (e, d, f), init_std, ("expert", "embed", "mlp"))
    self.up = param(k[2], (e, d, f), init_std, ("expert", "embed", "mlp"))
    self.down = param(k[3], (e, f, d), init_std, ("expert", "mlp", "embed"))
    self.d_shared = settings.shared_width
    if self.d_shared:
      g = self.d_shared
      self.shared_gate = param(k[4], (d, g), init_std, ("embed", "mlp"))
      self.shared_up = param(k[5], (d, g), init_std, ("embed", "mlp"))
      self.shared_down = param(k[6], (g, d), init_std, ("mlp", "embed"))

  def capacity(self, tokens: int) -> int | None:
    """Rows each expert keeps: ceil(capacity_factor · tokens · top_k / n_experts), or None (dropless)."""
    if self.capacity_factor is None:
      return None
    return max(1, math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts))

  def _key(self, key, purpose):
    return None if key is None else folded_keys(key, len(PURPOSES))[PURPOSES.index(purpose)]

  def __call__(self, x_BxSxD: jax.Array, key: jax.Array | None) -> tuple[jax.Array, dict]:
    """(y [B, S, D] in x's dtype, aux) with aux["load_balance_loss"] (weighted scalar) and
    aux["dropped_fraction"] (share of token-expert assignments dropped by the capacity)."""
    if key is None and self.recipe.stochastic:
      raise ValueError(f"MoEFeedForward: recipe {self.recipe.name!r} is stochastic: pass a key")
    b, s, d = x_BxSxD.shape
    t, e, k = b * s, self.n_experts, self.top_k
    x_TxD = x_BxSxD.reshape(t, d)
    logits_TxE = jnp.dot(x_TxD.astype(jnp.float32), self.router[...], precision=jax.lax.Precision.HIGHEST)
    probs_TxE = jax.nn.softmax(logits_TxE, axis=-1)
    weight_TxK, expert_TxK = jax.lax.top_k(probs_TxE, k)
    if self.renormalize:
      weight_TxK = weight_TxK / jnp.sum(weight_TxK, axis=-1, keepdims=True)
    if self.routed_scaling_factor != 1.0:
      weight_TxK = weight_TxK * self.routed_scaling_factor

    # Assignments slot-major (every token's first choice before any second choice), so that a
    # capacity drops lower-ranked choices first (both dispatches sort them by expert stably).
    expert_A = expert_TxK.T.reshape(-1).astype(jnp.int32)
    routed_E = jnp.bincount(expert_A, length=e)
    mesh = jax.sharding.get_abstract_mesh()
    if self.expert_dispatch == "all_to_all" and moe_ep.applies(mesh):
      weights = tuple(getattr(self, name)[...] for name in ("gate", "up", "down"))
      keys = tuple(self._key(key, name) for name in ("gate", "up", "down"))
      y_TxD = moe_ep.routed_experts(
        x_TxD,
        expert_TxK,
        weight_TxK,
        weights,
        keys,
        act=_ACTS[self.act],
        recipe=self.recipe,
        impl=self.impl,
        mesh=mesh,
        compute_dtype=self.compute_dtype,
      )
      kept = jnp.float32(t * k)  # dropless
    else:
      y_TxD, kept = self._routed(x_TxD, expert_A, weight_TxK, routed_E, key)
    if self.d_shared:
      y_TxD = y_TxD + self._shared(x_BxSxD, key).reshape(t, d).astype(jnp.float32)

    fraction_E = routed_E.astype(jnp.float32) / (t * k)
    balance = e * jnp.sum(fraction_E * jnp.mean(probs_TxE, axis=0))
    aux = {
      "load_balance_loss": self.aux_loss_weight * balance,
      "dropped_fraction": 1.0 - kept / (t * k),
    }
    return y_TxD.astype(x_BxSxD.dtype).reshape(b, s, d), aux

  def _routed(self, x_TxD, expert_A, weight_TxK, routed_E, key):
    """(routed experts' output [T, D] f32, rows kept (f32 scalar)): the one-program formulation."""
    t, d = x_TxD.shape
    e, k = self.n_experts, self.top_k
    token_A = jnp.tile(jnp.arange(t, dtype=jnp.int32), k)
    weight_A = weight_TxK.T.reshape(-1)
    order = jnp.argsort(expert_A, stable=True)
    cap = self.capacity(t)
    if cap is not None:
      rank_A = (
        jnp.zeros_like(expert_A)
        .at[order]
        .set(jnp.arange(t * k, dtype=jnp.int32) - (jnp.cumsum(routed_E) - routed_E)[expert_A[order]])
      )
      expert_A = jnp.where(rank_A < cap, expert_A, e)  # dropped: sorted past every group
      order = jnp.argsort(expert_A, stable=True)
    group_sizes = jnp.bincount(expert_A, length=e + 1)[:e].astype(jnp.int32)
    token_R, weight_R = token_A[order], weight_A[order]

    x_RxD = x_TxD[token_R]
    gq = lambda a, name: grouped_qmatmul(
      a,
      getattr(self, name)[...],
      group_sizes,
      key=self._key(key, name),
      recipe=self.recipe,
      impl=self.impl,
      compute_dtype=self.compute_dtype,
    )
    h_RxF = gated(_ACTS[self.act], gq(x_RxD, "gate"), gq(x_RxD, "up"))
    out_RxD = gq(h_RxF, "down")  # rows past sum(group_sizes) are exactly zero
    y_TxD = jnp.zeros((t, d), jnp.float32).at[token_R].add(out_RxD.astype(jnp.float32) * weight_R[:, None])
    return y_TxD, jnp.sum(group_sizes).astype(jnp.float32)

  def _shared(self, x_BxSxD, key):
    q = lambda a, name: qmatmul(
      a, getattr(self, name)[...], key=self._key(key, name), recipe=self.recipe, compute_dtype=self.compute_dtype
    )
    h = gated(_ACTS[self.act], q(x_BxSxD, "shared_gate"), q(x_BxSxD, "shared_up"))
    return q(h, "shared_down")
