"""DeepSeek-V2: multi-head latent attention (MLA; RoPE dims stored interleaved in checkpoints),
leading dense layers, then routed and shared experts (`DeepseekV2ForCausalLM`).

The block: multi-head latent attention and a dense or mixture-of-experts feed-forward. Dimension
letters: B batch, S sequence, D model width, N heads, C compressed KV rank (kv_lora_rank), Q
compressed query rank (q_lora_rank), P per-head dims without position (qk_nope_head_dim), R RoPE
dims (qk_rope_head_dim), U value head dim (v_head_dim), F FFN width.

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

| preset             | layers | width | params          | active         |
|--------------------|--------|-------|-----------------|----------------|
| `deepseek-v2-lite` | 27     | 2048  | 15,706,484,224  | 2,661,150,208  |
| `deepseek-tiny`    | 3      | 64    | 320,544         | 209,952        |

`deepseek-v2-lite` has the published dimensions (docs/models.md); `deepseek-tiny` is its structure at
width 64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from s3r.model.blocks import moe_call, moe_feed_forward
from s3r.model.config import ModelConfig, MoeFields, RopeScaling, check_positive
from s3r.model.families.base import Family
from s3r.model.families.llama import TINY
from s3r.model.hf import layouts
from s3r.model.hf.fields import Fields, read_common, refuse_export, rope, rope_parameters, write_common
from s3r.model.layers import Block, RMSNorm, attend, constrain, param, yarn_mscale
from s3r.model.layers import rope as rotate


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepSeekV2Config(MoeFields, ModelConfig):
  """DeepSeek-V2: multi-head latent attention (low-rank compressed KV with a decoupled RoPE part),
  the first `dense_layers` layers dense, the others MoE with shared experts. n_kv_heads, d_head are unused."""

  family: ClassVar[str] = "deepseek_v2"

  q_lora_rank: int | None = None  # rank of the query compression; None: full-rank query projection (V2-Lite)
  kv_lora_rank: int = 512  # rank C of the compressed key/value latent
  qk_nope_head_dim: int = 128  # per-head query/key dims without position encoding
  qk_rope_head_dim: int = 64  # per-head query dims with RoPE; the key's RoPE part is one head shared by all
  v_head_dim: int = 128  # per-head value dim

  def __post_init__(self):
    super().__post_init__()
    self._check_moe()
    check_positive(self, ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    if self.q_lora_rank is not None:
      check_positive(self, ("q_lora_rank",))
    if self.qk_rope_head_dim % 2:
      raise ValueError(f"DeepSeekV2Config.qk_rope_head_dim must be even for RoPE, got {self.qk_rope_head_dim}")
    if self.v_head_dim > self.qk_nope_head_dim + self.qk_rope_head_dim:
      raise ValueError(
        f"DeepSeekV2Config.v_head_dim ({self.v_head_dim}) must be <= qk_nope_head_dim + "
        f"qk_rope_head_dim ({self.qk_nope_head_dim + self.qk_rope_head_dim})"
      )

  def attention_params(self) -> int:
    d, n, qk = self.d_model, self.n_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
    q = d * n * qk if self.q_lora_rank is None else d * self.q_lora_rank + self.q_lora_rank * (1 + n * qk)
    kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # + latent RMSNorm
    return q + kv + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim) + n * self.v_head_dim * d


MLA_PROJECTIONS = ("q", "q_a", "q_b", "kv_a", "kv_b", "o", "gate", "up", "down")  # index j of the per-projection key
# The latent norms (q_a, kv_a) use this epsilon whatever norm_eps says, as DeepSeek's reference code does.
LATENT_NORM_EPS = 1e-6
# Tensor-parallel split (s3r.train.step.sharding RULES): heads are split; the latents (q_a, kv_a outputs) are
# replicated.
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
    k_rope_BxSx1xR = rotate(k_rope_BxSx1xR, cfg.rope_theta, cfg.rope_scaling, positions)
    if cache is not None:  # the latents of the cached positions and the new ones: L positions
      latent_BxSxC, k_rope_BxSx1xR = (
        cache.write(layer, "latent", latent_BxSxC),
        cache.write(layer, "k_rope", k_rope_BxSx1xR),
      )
    t = latent_BxSxC.shape[1]  # key positions: S, or L with a cache
    kv_BxTxNxPU = self._proj("kv_b", latent_BxSxC, layer_key).reshape(b, t, n, p + u)
    q_BxSxNxM = jnp.concatenate(
      [q_BxSxNxM[..., :p], rotate(q_BxSxNxM[..., p:], cfg.rope_theta, cfg.rope_scaling, positions)], axis=-1
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


def read(f: Fields) -> DeepSeekV2Config:
  f.expect("topk_method", {"greedy"}, "greedy", "s3r routes to the top-k experts of all (greedy)")
  f.expect("scoring_func", {"softmax"}, "softmax", "s3r's router is a softmax")
  f.expect("moe_layer_freq", {1}, 1, "s3r's MoE layers follow the dense ones without gaps")
  f.expect(
    "norm_topk_prob", {False}, False, "DeepSeek's own code and transformers disagree on it (transformers ignores it)"
  )
  theta, scaling = rope(rope_parameters(f), f, "rope_parameters", 10_000.0, mla=True)
  common = read_common(f)
  if common["n_kv_heads"] != common["n_heads"]:
    f.refuse("num_key_value_heads", common["n_kv_heads"], "MLA has one key/value head per query head")
  n_layers, rope_dim = common["n_layers"], int(f.get("qk_rope_head_dim", 64))
  per_head = common["d_model"] // common["n_heads"]
  q_lora = f.given("q_lora_rank", 1536)  # absent: transformers' default; null: no query compression
  return DeepSeekV2Config(
    **common,
    d_head=None if common["d_model"] % common["n_heads"] == 0 and per_head % 2 == 0 else rope_dim,
    rope_theta=theta,
    rope_scaling=scaling,
    n_experts=int(f.get("n_routed_experts", 64)),
    top_k=int(f.need("num_experts_per_tok")),
    d_expert=int(f.get("moe_intermediate_size", 1407)),
    n_shared=int(f.given("n_shared_experts", 2) or 0),  # absent: transformers' default; null: none
    dense_layers=min(int(f.get("first_k_dense_replace", 0)), n_layers),
    renormalize=False,
    routed_scaling_factor=float(f.get("routed_scaling_factor", 1.0)),
    aux_loss_weight=float(f.get("aux_loss_alpha", 0.001)),
    q_lora_rank=None if q_lora is None else int(q_lora),
    kv_lora_rank=int(f.get("kv_lora_rank", 512)),
    qk_nope_head_dim=int(f.get("qk_nope_head_dim", 128)),
    qk_rope_head_dim=rope_dim,
    v_head_dim=int(f.get("v_head_dim", 128)),
  )


def write(cfg: DeepSeekV2Config) -> dict:
  if cfg.renormalize:
    raise refuse_export(cfg, "renormalize", "transformers' DeepSeek-V2 does not renormalize the top-k weights")
  out = write_common(cfg, "DeepseekV2ForCausalLM", "deepseek_v2")
  return {
    **out,
    "num_key_value_heads": cfg.n_heads,
    "head_dim": cfg.qk_rope_head_dim,
    "hidden_act": "silu",
    "mlp_bias": False,
    "n_routed_experts": cfg.n_experts,
    "num_experts_per_tok": cfg.top_k,
    "moe_intermediate_size": cfg.d_expert,
    "n_shared_experts": cfg.n_shared,
    "first_k_dense_replace": cfg.dense_layers,
    "routed_scaling_factor": cfg.routed_scaling_factor,
    "aux_loss_alpha": cfg.aux_loss_weight,
    "topk_method": "greedy",
    "norm_topk_prob": False,
    "q_lora_rank": cfg.q_lora_rank,
    "kv_lora_rank": cfg.kv_lora_rank,
    "qk_nope_head_dim": cfg.qk_nope_head_dim,
    "qk_rope_head_dim": cfg.qk_rope_head_dim,
    "v_head_dim": cfg.v_head_dim,
  }


def _mla_tensors(cfg: DeepSeekV2Config, b: layouts.Path, p: str) -> list[layouts.Entry]:
  a, r = f"{p}.self_attn", cfg.qk_rope_head_dim
  q = layouts.RopeLinear(group=cfg.qk_nope_head_dim + r, r=r)
  if cfg.q_lora_rank is None:
    out = [layouts.linear((*b, "q"), f"{a}.q_proj", q)]
  else:
    out = [
      layouts.linear((*b, "q_a"), f"{a}.q_a_proj"),
      layouts.norm((*b, "q_a_norm"), f"{a}.q_a_layernorm"),
      layouts.linear((*b, "q_b"), f"{a}.q_b_proj", q),
    ]
  return out + [
    layouts.linear((*b, "kv_a"), f"{a}.kv_a_proj_with_mqa", layouts.RopeLinear(group=cfg.kv_lora_rank + r, r=r)),
    layouts.norm((*b, "kv_a_norm"), f"{a}.kv_a_layernorm"),
    layouts.linear((*b, "kv_b"), f"{a}.kv_b_proj"),
    layouts.linear((*b, "o"), f"{a}.o_proj"),
  ]


def block_tensors(cfg: DeepSeekV2Config, layer: int, p: str, fused: bool) -> list[layouts.Entry]:
  b = ("blocks", layer)
  ffn = layouts.moe(cfg, b, p, fused) if cfg.is_moe(layer) else layouts.gated(b, f"{p}.mlp")
  return _mla_tensors(cfg, b, p) + layouts.pre_norms(b, p) + ffn


PRESETS = {
  "deepseek-v2-lite": DeepSeekV2Config(
    vocab_size=102400,
    d_model=2048,
    n_layers=27,
    n_heads=16,
    n_kv_heads=16,
    d_ff=10944,
    max_seq_len=163840,
    rope_scaling=RopeScaling(
      kind="yarn",
      factor=40.0,
      original_max_seq_len=4096,
      beta_fast=32.0,
      beta_slow=1.0,
      mscale=0.707,
      mscale_all_dim=0.707,
    ),
    n_experts=64,
    top_k=6,
    d_expert=1408,
    n_shared=2,
    dense_layers=1,
    renormalize=False,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
  ),
  "deepseek-tiny": DeepSeekV2Config(
    **{**TINY, "n_layers": 3, "n_kv_heads": 4},
    rope_scaling=RopeScaling(kind="yarn", factor=4.0, original_max_seq_len=32, mscale=0.707, mscale_all_dim=0.707),
    n_experts=8,
    top_k=2,
    d_expert=48,
    n_shared=1,
    dense_layers=1,
    renormalize=False,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
  ),
}

FAMILY = Family(
  config=DeepSeekV2Config,
  block=DeepSeekV2Block,
  readers={"DeepseekV2ForCausalLM": read},
  writer=write,
  block_tensors=block_tensors,
  presets=PRESETS,
  sibling="deepseek-tiny",
  inference={"capacity_factor": None},  # dropless routing: a capacity would depend on a step's token count
)
