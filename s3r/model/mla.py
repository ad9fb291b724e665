"""DeepSeek-V2 block: multi-head latent attention (MLA) and a dense or mixture-of-experts feed-forward.

Dimension letters: B batch, S sequence, D model width, N heads, C compressed KV rank
(kv_lora_rank), Q compressed query rank (q_lora_rank), P per-head dims without position
(qk_nope_head_dim), R RoPE dims (qk_rope_head_dim), U value head dim (v_head_dim), F FFN width.

Attention (DeepSeek-V2, section 2.1): the keys and values of all heads come from one
compressed latent c = RMSNorm(h W_kv_a[:, :C]) [B, S, C] through W_kv_b [C, N(P + U)]; the
position information travels separately: a RoPE part of R dims per query head and ONE
RoPE key part of R dims shared by all heads (h W_kv_a[:, C:]). Queries are h W_q [D, N(P + R)],
or with q_lora_rank the low-rank h W_q_a -> RMSNorm -> W_q_b. Scores use 1 / sqrt(P + R) times
YaRN's mscale squared. Every projection (q or q_a, q_b; kv_a, kv_b, o; gate, up, down) is a recipe
`qmatmul`; the value heads are zero-padded to P + R dims so that the fused attention kernel
(`jax.nn.dot_product_attention`, equal q/k/v head dims) applies.

Generation caches the latent: per position the normalized c (C numbers) and the RoPE key part
(R numbers) instead of N(P + U) + R for expanded keys and values; every step re-expands the
cached latents through W_kv_b (a per-token product, so the expanded keys equal the full forward's).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from s3r.model.blocks import moe_call, moe_feed_forward
from s3r.model.config import DeepSeekV2Config
from s3r.model.layers import Block, RMSNorm, attend, constrain, param, rope, yarn_mscale

MLA_PROJECTIONS = ("q", "q_a", "q_b", "kv_a", "kv_b", "o", "gate", "up", "down")  # index j of the per-projection key
# The latent norms (q_a, kv_a) use this epsilon whatever norm_eps says, as DeepSeek's reference code does.
LATENT_NORM_EPS = 1e-6
# Tensor-parallel split (s3r.train.sharding RULES): heads are split; the latents (q_a, kv_a outputs) are replicated.
_MLA_TP_SPLIT = {
  "q": "column",
  "q_a": None,
  "q_b": "column",
  "kv_a": None,
  "kv_b": "column",
  "o": "row",
  "gate": "column",
  "up": "column",
  "down": "row",
}


class DeepSeekV2Block(Block[DeepSeekV2Config]):
  """Pre-norm block: x + MLA(norm(x)), then + (SwiGLU or MoE)(norm(x))."""

  PROJECTIONS = MLA_PROJECTIONS
  TP_SPLIT = _MLA_TP_SPLIT

  def __init__(self, cfg: DeepSeekV2Config, key, layer: int = 0):  # noqa: PLW0231 (replaces Block's attention)
    self.cfg, self.layer = cfg, layer
    d, n, c, r = cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    qk = cfg.qk_nope_head_dim + r
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    k = dict(zip(MLA_PROJECTIONS, jax.random.split(key, len(MLA_PROJECTIONS))))
    self.attn_norm = self._norm(d)
    if cfg.q_lora_rank is None:
      self.q = param(k["q"], (d, n * qk), std, ("embed", "heads"))
    else:
      self.q_a = param(k["q_a"], (d, cfg.q_lora_rank), std, ("embed", None))
      self.q_a_norm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS, dtype=cfg.act_dtype)
      self.q_b = param(k["q_b"], (cfg.q_lora_rank, n * qk), std, (None, "heads"))
    self.kv_a = param(k["kv_a"], (d, c + r), std, ("embed", None))
    self.kv_a_norm = RMSNorm(c, LATENT_NORM_EPS, dtype=cfg.act_dtype)
    self.kv_b = param(k["kv_b"], (c, n * (cfg.qk_nope_head_dim + cfg.v_head_dim)), std, (None, "heads"))
    self.o = param(k["o"], (n * cfg.v_head_dim, d), out_std, ("heads", "embed"))
    self.mlp_norm = self._norm(d)
    if cfg.is_moe(layer):
      self.moe = moe_feed_forward(cfg, k["gate"])
    else:
      self._init_ffn(k, std, out_std)

  def _softmax_scale(self) -> float:
    cfg, scaling = self.cfg, self.cfg.rope_scaling
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if scaling is not None and scaling.kind == "yarn" and scaling.mscale_all_dim:
      scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return scale

  @classmethod
  def cache_shapes(cls, cfg: DeepSeekV2Config) -> dict[str, tuple[int, ...]]:
    return {"latent": (cfg.kv_lora_rank,), "k_rope": (1, cfg.qk_rope_head_dim)}

  def _attention(self, h_BxSxD, layer_key, cache=None, layer=None):
    cfg = self.cfg
    b, s, _ = h_BxSxD.shape
    n, p, r, u, c = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    positions = None if cache is None else cache.positions_BxS
    if cfg.q_lora_rank is None:
      q_BxSxNM = self._proj("q", h_BxSxD, layer_key)
    else:
      q_BxSxNM = self._proj("q_b", self.q_a_norm(self._proj("q_a", h_BxSxD, layer_key)), layer_key)
    q_BxSxNxM = q_BxSxNM.reshape(b, s, n, p + r)
    kv_BxSxCR = self._proj("kv_a", h_BxSxD, layer_key)
    latent_BxSxC, k_rope_BxSx1xR = self.kv_a_norm(kv_BxSxCR[..., :c]), kv_BxSxCR[..., c:].reshape(b, s, 1, r)
    k_rope_BxSx1xR = rope(k_rope_BxSx1xR, cfg.rope_theta, cfg.rope_scaling, positions)
    if cache is not None:  # the latents of the cached positions and the new ones: L positions
      latent_BxSxC, k_rope_BxSx1xR = (
        cache.write(layer, "latent", latent_BxSxC),
        cache.write(layer, "k_rope", k_rope_BxSx1xR),
      )
    t = latent_BxSxC.shape[1]  # key positions: S, or L with a cache
    kv_BxTxNxPU = self._proj("kv_b", latent_BxSxC, layer_key).reshape(b, t, n, p + u)
    q_BxSxNxM = jnp.concatenate(
      [q_BxSxNxM[..., :p], rope(q_BxSxNxM[..., p:], cfg.rope_theta, cfg.rope_scaling, positions)], axis=-1
    )
    k_BxTxNxM = jnp.concatenate([kv_BxTxNxPU[..., :p], jnp.broadcast_to(k_rope_BxSx1xR, (b, t, n, r))], axis=-1)
    v_BxTxNxM = jnp.pad(kv_BxTxNxPU[..., p:], ((0, 0), (0, 0), (0, 0), (0, p + r - u)))
    q_BxSxNxM = constrain(q_BxSxNxM, ("batch", "seq", "act_heads", None))
    k_BxTxNxM = constrain(k_BxTxNxM, ("batch", "seq", "act_heads", None))
    v_BxTxNxM = constrain(v_BxTxNxM, ("batch", "seq", "act_heads", None))
    a_BxSxNxM = attend(q_BxSxNxM, k_BxTxNxM, v_BxTxNxM, cfg, cache, scale=self._softmax_scale())
    return self._proj("o", a_BxSxNxM[..., :u].reshape(b, s, n * u), layer_key)

  def _ffn(self, h_BxSxD, layer_key):
    if not self.cfg.is_moe(self.layer):
      return super()._ffn(h_BxSxD, layer_key)
    return moe_call(self.moe, h_BxSxD, layer_key, len(MLA_PROJECTIONS))
