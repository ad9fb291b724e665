"""Blocks of the Qwen3, Gemma 3 and Qwen3-MoE families: the Llama block with its hooks overridden.

Dimension letters: B batch, S sequence, D model width, N query heads, K key/value heads,
H head dim, F FFN hidden width.

- Qwen3: RMSNorm over the head dim of every query and key head before RoPE (QK-norm).
- Gemma 3: QK-norm, RMSNorm with (1 + scale) before and after each sublayer, GeGLU with the
  tanh-approximated GELU, attention scaled by query_pre_attn_scalar ** -0.5; every
  `global_every`-th layer attends globally with RoPE base `rope_theta` (and `rope_scaling`),
  the others within a causal window of `sliding_window` positions with base `local_rope_theta`
  (under the decoder's scan, a `jax.lax.cond` on the layer index picks the kind: each kind's
  computation is the one an unrolled layer of that kind runs).
- Qwen3-MoE: Qwen3 attention with the routed feed-forward `s3r.model.moe.MoEFeedForward`.
Every projection is a recipe `qmatmul` (Block._proj); norms, RoPE and attention as in the Llama block.
"""

from __future__ import annotations

import jax
from flax import nnx

from s3r.model.config import Gemma3Config, ModelConfig, MoeFields, Qwen3MoeConfig
from s3r.model.layers import Block, RMSNorm, attend, rope

MOE_KEY = len(Block.PROJECTIONS)  # fold-in index of the MoE feed-forward's key (after the attention projections)


class Qwen3Block[C: ModelConfig](Block[C]):
  """Llama block with per-head RMSNorm of queries and keys."""

  def __init__(self, cfg: C, key, layer: int = 0):
    super().__init__(cfg, key, layer)
    self.q_norm = self._norm(cfg.head_dim)
    self.k_norm = self._norm(cfg.head_dim)

  def _qk(self, q_BxSxNxH, k_BxSxKxH):
    return self.q_norm(q_BxSxNxH), self.k_norm(k_BxSxKxH)


class Gemma3Block(Qwen3Block[Gemma3Config]):
  """Gemma 3 block: QK-norm, sandwich norms, GeGLU, interleaved sliding-window and global attention."""

  def __init__(self, cfg: Gemma3Config, key, layer: int = 0):
    super().__init__(cfg, key, layer)
    self.post_attn_norm = self._norm(cfg.d_model)
    self.post_mlp_norm = self._norm(cfg.d_model)

  def _norm(self, dim: int) -> RMSNorm:
    return RMSNorm(dim, self.cfg.norm_eps, offset=self.cfg.norm_offset, dtype=self.cfg.act_dtype)

  def _per_kind(self, layer, global_fn, local_fn):
    """global_fn() on a global layer, local_fn() on a local one: chosen in Python for a static layer
    index, by `jax.lax.cond` (which runs only the chosen branch) for a traced one (the scanned decoder)."""
    is_global = self.cfg.is_global(self.layer if layer is None else layer)
    if isinstance(is_global, bool):
      return global_fn() if is_global else local_fn()
    return jax.lax.cond(is_global, global_fn, local_fn)

  def _rope(self, x_BxSxNxH, positions_BxS=None, layer=None):
    cfg = self.cfg
    return self._per_kind(
      layer,
      lambda: rope(x_BxSxNxH, cfg.rope_theta, cfg.rope_scaling, positions_BxS),
      lambda: rope(x_BxSxNxH, cfg.local_rope_theta, None, positions_BxS),
    )

  def _attend(self, q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cache=None, layer=None):
    cfg = self.cfg
    scale = cfg.query_pre_attn_scalar**-0.5
    run = lambda window: lambda: attend(q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cfg, cache, scale=scale, window=window)
    return self._per_kind(layer, run(None), run(cfg.sliding_window))

  def _act(self, gate_BxSxF):
    return jax.nn.gelu(gate_BxSxF, approximate=True)

  def _after(self, name: str, y_BxSxD):
    return (self.post_attn_norm if name == "attn" else self.post_mlp_norm)(y_BxSxD)


def moe_feed_forward(cfg: MoeFields, key: jax.Array) -> nnx.Module:
  """The routed MoE feed-forward of an MoE-family config (imported only by the MoE families)."""
  from s3r.model.moe import MoEFeedForward  # noqa: PLC0415 (dense families never need it)

  return MoEFeedForward(
    d_model=cfg.d_model,
    d_expert=cfg.d_expert,
    n_experts=cfg.n_experts,
    top_k=cfg.top_k,
    n_shared=cfg.n_shared,
    d_shared=cfg.n_shared * cfg.d_expert if cfg.n_shared else None,
    renormalize=cfg.renormalize,
    routed_scaling_factor=cfg.routed_scaling_factor,
    capacity_factor=cfg.capacity_factor,
    expert_dispatch=cfg.expert_dispatch,
    aux_loss_weight=cfg.aux_loss_weight,
    recipe=cfg.recipe,
    compute_dtype=cfg.act_dtype,
    act="silu",
    rngs=nnx.Rngs(key),
  )


def moe_call(moe: nnx.Module, h_BxSxD, layer_key, index: int):
  """(output, aux) of the MoE feed-forward with the layer key folded with `index`."""
  key = None if layer_key is None else jax.random.fold_in(layer_key, index)
  return moe(h_BxSxD, key)


class Qwen3MoeBlock(Qwen3Block[Qwen3MoeConfig]):
  """Qwen3 attention with a routed mixture-of-experts feed-forward (dense gated FFN in the first
  `dense_layers` layers)."""

  def _init_ffn(self, k: dict, std: float, out_std: float):
    if self.cfg.is_moe(self.layer):
      self.moe = moe_feed_forward(self.cfg, k["gate"])
    else:
      super()._init_ffn(k, std, out_std)

  def _ffn(self, h_BxSxD, layer_key):
    if not self.cfg.is_moe(self.layer):
      return super()._ffn(h_BxSxD, layer_key)
    return moe_call(self.moe, h_BxSxD, layer_key, MOE_KEY)
