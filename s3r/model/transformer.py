"""The decoder in Flax NNX whose block projections are INT8 `qmatmul`s: shared pieces, the
Llama block, the model and its functional interface. Other families' blocks live in
`s3r.model.blocks` (Qwen3, Gemma 3, Qwen3-MoE) and `s3r.model.mla` (DeepSeek-V2).

Dimension letters in tensor names:
  B batch, S sequence, D model width, N query heads, K key/value heads, H head dim,
  F gated FFN hidden width, V vocabulary.

Numerics (ALGORITHM.md §2): every projection of every block (Llama: q, k, v, o, gate, up,
down) goes through `s3r.quant.qmatmul` with the config's recipe; the token embedding, the
logits projection, the attention score and probability-value products, RMSNorm, RoPE and
softmax stay in bf16 (norm, RoPE and softmax math in f32). Parameters are f32 master
weights; activations are bf16; logits are f32.

Randomness: one step key enters `Transformer.__call__`; the key of projection j of layer l
is `fold_in(fold_in(step_key, l), j)` (j: index in the block's PROJECTIONS), so every
projection of every step gets its own key.

Sharding: every parameter carries `logical_axes` metadata, and activations are tagged with
logical names through `constrain`; `s3r.train.sharding` maps both onto the device mesh.
Under a mesh with a "tensor" axis, `tp_partial_sums="bf16"` (the default) makes the GEMM that
contracts a projection's tensor-split dimension round each shard's output to bf16 before the
cross-shard sum, as the paper's TPU runs do; "int32" keeps XLA's exact int32 partial sums.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.model.config import ModelConfig, RopeScaling
from s3r.quant import qmatmul
from s3r.quant import recipe as get_recipe

ACT_DTYPE = jnp.bfloat16
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # index j of the per-projection key
# Megatron-style split of each projection's weight over the "tensor" mesh axis (s3r.train.sharding
# RULES): column-parallel W [D, F] split along its outputs, row-parallel along its inputs.
_TP_SPLIT = {"q": "column", "k": "column", "v": "column", "o": "row", "gate": "column", "up": "column", "down": "row"}

_constraint: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("s3r_activation_constraint", default=None)
_projection: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("s3r_projection", default=None)


@contextlib.contextmanager
def activation_sharding(fn: Callable[[jax.Array, tuple], jax.Array]):
  """While tracing inside this context, `constrain(x, axes)` calls `fn(x, axes)`."""
  token = _constraint.set(fn)
  try:
    yield
  finally:
    _constraint.reset(token)


@contextlib.contextmanager
def intercept_projections(fn: Callable):
  """While tracing inside this context, every block projection calls
  `fn(name, x, w, key=..., recipe=...)` instead of `qmatmul` (diagnostics: record inputs,
  add probes to outputs). Calls come in layer order, then q, k, v, o, gate, up, down."""
  token = _projection.set(fn)
  try:
    yield
  finally:
    _projection.reset(token)


def constrain(x: jax.Array, axes: tuple) -> jax.Array:
  """Tags activation `x` with logical axis names (a no-op outside `activation_sharding`)."""
  fn = _constraint.get()
  return x if fn is None else fn(x, axes)


def _param(key, shape, std, axes) -> nnx.Param:
  return nnx.Param(std * jax.random.normal(key, shape, jnp.float32), logical_axes=axes)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis in f32: x / rms(x) * scale, or * (1 + scale) with `offset` (Gemma;
  the scale then starts at 0)."""

  def __init__(self, dim: int, eps: float, offset: bool = False):
    init = jnp.zeros if offset else jnp.ones
    self.scale = nnx.Param(init((dim,), jnp.float32), logical_axes=("norm",))
    self.eps, self.offset = eps, offset

  def __call__(self, x_BxSxD):
    x = x_BxSxD.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    scale = 1.0 + self.scale[...] if self.offset else self.scale[...]
    return (x * scale).astype(ACT_DTYPE)


def _yarn_mscale(factor: float, mscale: float) -> float:
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(h: int, theta: float, scaling: RopeScaling | None):
  """The h/2 inverse frequencies of RoPE with base `theta`, rescaled as `scaling` says, and the
  factor on cos/sin (YaRN's magnitude correction; 1 otherwise)."""
  inv_freq = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
  if scaling is None:
    return inv_freq, 1.0
  if scaling.kind == "linear":
    return inv_freq / scaling.factor, 1.0
  if scaling.kind == "llama3":  # keep short wavelengths, divide long ones by factor, interpolate in between
    wavelen = 2 * math.pi / inv_freq
    smooth = (scaling.original_max_seq_len / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor
    )
    mid = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    long_ = wavelen > scaling.original_max_seq_len / scaling.low_freq_factor
    short = wavelen < scaling.original_max_seq_len / scaling.high_freq_factor
    return jnp.where(long_, inv_freq / scaling.factor, jnp.where(short, inv_freq, mid)), 1.0
  # yarn: extrapolate the high frequencies, interpolate (/ factor) the low ones, linear ramp between.
  dim_of = lambda rotations: (
    h * math.log(scaling.original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
  )
  low = max(math.floor(dim_of(scaling.beta_fast)), 0)
  high = min(math.ceil(dim_of(scaling.beta_slow)), h - 1)
  ramp = jnp.clip((jnp.arange(h // 2, dtype=jnp.float32) - low) / max(high - low, 1e-3), 0, 1)
  inv_freq = inv_freq / scaling.factor * ramp + inv_freq * (1 - ramp)
  return inv_freq, _yarn_mscale(scaling.factor, scaling.mscale) / _yarn_mscale(scaling.factor, scaling.mscale_all_dim)


def rope(x_BxSxNxH, theta: float, scaling: RopeScaling | None = None):
  """Rotary position embedding (rotate-half form), computed in f32."""
  s, h = x_BxSxNxH.shape[1], x_BxSxNxH.shape[-1]
  inv_freq, magnitude = rope_frequencies(h, theta, scaling)
  angle_SxH2 = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle_SxH2)[None, :, None, :], jnp.sin(angle_SxH2)[None, :, None, :]
  if magnitude != 1.0:
    cos, sin = cos * magnitude, sin * magnitude
  x = x_BxSxNxH.astype(jnp.float32)
  x1, x2 = x[..., : h // 2], x[..., h // 2 :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxSxNxH.dtype)


class Block(nnx.Module):
  """Llama block (pre-norm): x + attention(norm(x)), then + SwiGLU(norm(x)).

  Other families subclass it (s3r.model.blocks) and override the hooks: `_qk` (queries and keys
  before RoPE), `_attend` (the attention core), `_after` (a sublayer's output before the residual
  add) and `_ffn` (the feed-forward, which also returns the MoE auxiliary terms)."""

  PROJECTIONS = PROJECTIONS
  TP_SPLIT = _TP_SPLIT

  def __init__(self, cfg: ModelConfig, key, layer: int = 0):
    self.cfg, self.layer = cfg, layer
    d, nh, kh = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    k = dict(zip(PROJECTIONS, jax.random.split(key, len(PROJECTIONS))))
    self.attn_norm = self._norm(d)
    self.q = _param(k["q"], (d, nh), std, ("embed", "heads"))
    self.k = _param(k["k"], (d, kh), std, ("embed", "kv_heads"))
    self.v = _param(k["v"], (d, kh), std, ("embed", "kv_heads"))
    self.o = _param(k["o"], (nh, d), out_std, ("heads", "embed"))
    self.mlp_norm = self._norm(d)
    self._init_ffn(k, std, out_std)

  def _norm(self, dim: int) -> RMSNorm:
    return RMSNorm(dim, self.cfg.norm_eps)

  def _init_ffn(self, k: dict, std: float, out_std: float):
    d, f = self.cfg.d_model, self.cfg.d_ff
    self.gate = _param(k["gate"], (d, f), std, ("embed", "mlp"))
    self.up = _param(k["up"], (d, f), std, ("embed", "mlp"))
    self.down = _param(k["down"], (f, d), out_std, ("mlp", "embed"))

  def _proj(self, name: str, x, layer_key):
    key = None if layer_key is None else jax.random.fold_in(layer_key, self.PROJECTIONS.index(name))
    override = _projection.get()
    if override is not None:
      return override(name, x, getattr(self, name)[...], key=key, recipe=self.cfg.recipe)
    tp = self.TP_SPLIT[name] if self.cfg.tp_partial_sums == "bf16" else None
    return qmatmul(x, getattr(self, name)[...], key=key, recipe=self.cfg.recipe, tp=tp)

  def _qk(self, q_BxSxNxH, k_BxSxKxH):
    return q_BxSxNxH, k_BxSxKxH

  def _rope(self, x_BxSxNxH):
    return rope(x_BxSxNxH, self.cfg.rope_theta, self.cfg.rope_scaling)

  def _attend(self, q_BxSxNxH, k_BxSxKxH, v_BxSxKxH):
    # bf16 scores and probability-value products (f32 softmax); attention_impl="cudnn": fused flash attention.
    return jax.nn.dot_product_attention(
      q_BxSxNxH, k_BxSxKxH, v_BxSxKxH, is_causal=True, implementation=self.cfg.attention_impl
    )

  def _after(self, name: str, y_BxSxD):
    return y_BxSxD

  def _attention(self, h_BxSxD, layer_key):
    cfg = self.cfg
    b, s, _ = h_BxSxD.shape
    q_BxSxNxH = self._proj("q", h_BxSxD, layer_key).reshape(b, s, cfg.n_heads, cfg.head_dim)
    k_BxSxKxH = self._proj("k", h_BxSxD, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    v_BxSxKxH = self._proj("v", h_BxSxD, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    q_BxSxNxH, k_BxSxKxH = self._qk(q_BxSxNxH, k_BxSxKxH)
    q_BxSxNxH = constrain(self._rope(q_BxSxNxH), ("batch", "seq", "act_heads", None))
    k_BxSxKxH = constrain(self._rope(k_BxSxKxH), ("batch", "seq", "act_kv_heads", None))
    v_BxSxKxH = constrain(v_BxSxKxH, ("batch", "seq", "act_kv_heads", None))
    a_BxSxNxH = self._attend(q_BxSxNxH, k_BxSxKxH, v_BxSxKxH)
    return self._proj("o", a_BxSxNxH.reshape(b, s, -1), layer_key)

  def _act(self, gate_BxSxF):
    return jax.nn.silu(gate_BxSxF)

  def _ffn(self, h_BxSxD, layer_key):
    gate_BxSxF = self._proj("gate", h_BxSxD, layer_key)
    up_BxSxF = self._proj("up", h_BxSxD, layer_key)
    hidden_BxSxF = constrain(self._act(gate_BxSxF) * up_BxSxF, ("batch", "seq", "act_mlp"))
    return self._proj("down", hidden_BxSxF, layer_key), {}

  def __call__(self, x_BxSxD, layer_key):
    """(the block's output [B, S, D], MoE auxiliary terms: {} for a dense block)."""
    y_BxSxD = self._after("attn", self._attention(self.attn_norm(x_BxSxD), layer_key))
    x_BxSxD = constrain(x_BxSxD + y_BxSxD, ("batch", "seq", "act_embed"))
    y_BxSxD, aux = self._ffn(self.mlp_norm(x_BxSxD), layer_key)
    return constrain(x_BxSxD + self._after("mlp", y_BxSxD), ("batch", "seq", "act_embed")), aux


def block_class(cfg: ModelConfig) -> type[nnx.Module]:
  """The block of the config's family."""
  if cfg.family == "llama":
    return Block
  from s3r.model import blocks, mla  # noqa: PLC0415 (the families build on this module)

  return {
    "qwen3": blocks.Qwen3Block,
    "gemma3": blocks.Gemma3Block,
    "qwen3_moe": blocks.Qwen3MoeBlock,
    "deepseek_v2": mla.DeepSeekV2Block,
  }[cfg.family]


class Transformer(nnx.Module):
  """Token embedding, `n_layers` blocks of the config's family, final RMSNorm, logits projection
  (untied, or the embedding's transpose with `tie_embeddings`; Gemma 3 scales the embedding by sqrt(D))."""

  def __init__(self, cfg: ModelConfig, *, key: jax.Array):
    embed_key, blocks_key, out_key = jax.random.split(key, 3)
    self.embed = _param(embed_key, (cfg.vocab_size, cfg.d_model), cfg.init_std, ("vocab", "embed"))
    block = block_class(cfg)
    self.blocks = nnx.List([block(cfg, k, layer) for layer, k in enumerate(jax.random.split(blocks_key, cfg.n_layers))])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, offset=cfg.family == "gemma3")
    if not cfg.tie_embeddings:
      self.out = _param(out_key, (cfg.d_model, cfg.vocab_size), cfg.init_std, ("embed", "vocab"))
    self.cfg = cfg

  def __call__(
    self, tokens_BxS: jax.Array, *, key: jax.Array | None = None, probes: list | None = None, aux: list | None = None
  ) -> jax.Array:
    """Returns f32 logits [B, S, V]. `key` (one per step) is required by stochastic recipes.

    `probes` (diagnostics): one [B, S, D] array per block, added to the block's input; the
    gradient with respect to a zero probe is the activation gradient entering that block.
    `aux`: a list that receives each MoE layer's auxiliary dict (load_balance_loss, dropped_fraction).
    """
    cfg = self.cfg
    if tokens_BxS.shape[1] > cfg.max_seq_len:
      raise ValueError(f"sequence length {tokens_BxS.shape[1]} exceeds max_seq_len {cfg.max_seq_len}")
    if key is None and get_recipe(cfg.recipe).stochastic:
      raise ValueError(f"recipe {cfg.recipe!r} is stochastic: pass a step key")
    x_BxSxD = self.embed[...].astype(ACT_DTYPE)[tokens_BxS]
    if cfg.family == "gemma3":
      x_BxSxD = x_BxSxD * jnp.asarray(math.sqrt(cfg.d_model), ACT_DTYPE)
    x_BxSxD = constrain(x_BxSxD, ("batch", "seq", "act_embed"))
    for layer, block in enumerate(self.blocks):
      layer_key = None if key is None else jax.random.fold_in(key, layer)
      if probes is not None:
        x_BxSxD = x_BxSxD + probes[layer].astype(x_BxSxD.dtype)
      if cfg.remat:
        x_BxSxD, block_aux = nnx.remat(lambda blk, x, k: blk(x, k))(block, x_BxSxD, layer_key)
      else:
        x_BxSxD, block_aux = block(x_BxSxD, layer_key)
      if aux is not None and block_aux:
        aux.append(block_aux)
    h_BxSxD = self.final_norm(x_BxSxD)
    w_DxV = self.embed[...].T if cfg.tie_embeddings else self.out[...]
    logits_BxSxV = jnp.dot(h_BxSxD, w_DxV.astype(ACT_DTYPE), preferred_element_type=jnp.float32)
    return constrain(logits_BxSxV, ("batch", "seq", "act_vocab"))


# Functional interface: parameters as a plain nested dict of f32 arrays (what the trainer,
# the optimizer and the checkpoints see), the module structure as a static graphdef.


def graphdef(cfg: ModelConfig) -> nnx.GraphDef:
  """The static structure of the model (no parameters are allocated)."""
  return nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, key=jax.random.key(0))))


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
  """Freshly initialized parameters: a nested dict of f32 arrays (jit-able)."""
  return nnx.to_pure_dict(nnx.state(Transformer(cfg, key=key)))


def apply(
  graphdef: nnx.GraphDef, params: dict, tokens_BxS: jax.Array, *, key: jax.Array | None, probes: list | None = None
) -> jax.Array:
  """f32 logits [B, S, V] of the model `graphdef` with parameters `params` (see Transformer)."""
  return nnx.merge(graphdef, params)(tokens_BxS, key=key, probes=probes)


def apply_with_aux(
  graphdef: nnx.GraphDef, params: dict, tokens_BxS: jax.Array, *, key: jax.Array | None
) -> tuple[jax.Array, dict]:
  """(f32 logits [B, S, V], MoE auxiliary terms): `load_balance_loss` summed over the MoE layers
  (add it to the training loss) and `dropped_fraction` averaged over them; {} for a dense model."""
  per_layer: list[dict] = []
  logits_BxSxV = nnx.merge(graphdef, params)(tokens_BxS, key=key, aux=per_layer)
  if not per_layer:
    return logits_BxSxV, {}
  return logits_BxSxV, {
    "load_balance_loss": sum(a["load_balance_loss"] for a in per_layer),
    "dropped_fraction": sum(a["dropped_fraction"] for a in per_layer) / len(per_layer),
  }


def logical_axes(cfg: ModelConfig) -> dict:
  """The params tree with each leaf replaced by a PartitionSpec of logical axis names."""
  state = jax.eval_shape(lambda: nnx.split(Transformer(cfg, key=jax.random.key(0)))[1])
  is_var = lambda x: isinstance(x, nnx.Variable)
  specs = jax.tree.map(lambda v: jax.sharding.PartitionSpec(*v.get_metadata()["logical_axes"]), state, is_leaf=is_var)
  return nnx.to_pure_dict(specs)
