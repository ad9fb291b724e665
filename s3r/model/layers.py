"""The pieces every decoder family shares, and the Llama block the others subclass.

Dimension letters in tensor names:
  B batch, S sequence, D model width, N query heads, K key/value heads, H head dim,
  F gated FFN hidden width, V vocabulary.

Numerics (docs/algorithm.md §2): every block projection (Llama: q, k, v, o, gate, up, down) goes
through `s3r.quant.qmatmul` with the config's recipe; attention scores and probability-value
products, RMSNorm, RoPE and softmax stay in the activation dtype (norm, RoPE and softmax math in
f32). Parameters are f32 master weights; activations are bf16, or f32 with `act_dtype="float32"`
(evaluation, generation), where the `bf16` recipe's projections multiply in f32 too.

Generation (s3r.model.generation) passes a `cache.Step` through every block: RoPE then takes the
new tokens' positions from it, and attention writes the new keys and values into it and attends
over the cached ones under its mask.

One tracing context reaches into every block without threading arguments through the model:
`activation_sharding` (how `constrain` tags activations for the mesh).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.model.config import ModelConfig, RopeScaling
from s3r.quant import qmatmul

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
"""The quantized projections of a dense block, in the order of their PRNG keys (index j of the per-projection key)."""
# Megatron-style split of each projection's weight over the "tensor" mesh axis (s3r.train.step.sharding
# RULES): column-parallel W [D, F] split along its outputs, row-parallel along its inputs.
_TP_SPLIT = {"q": "column", "k": "column", "v": "column", "o": "row", "gate": "column", "up": "column", "down": "row"}

_constraint: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("s3r_activation_constraint", default=None)


@contextlib.contextmanager
def activation_sharding(fn: Callable[[jax.Array, tuple], jax.Array]):
  """While tracing inside this context, `constrain(x, axes)` calls `fn(x, axes)`."""
  token = _constraint.set(fn)
  try:
    yield
  finally:
    _constraint.reset(token)


def constrain(x: jax.Array, axes: tuple) -> jax.Array:
  """Tags activation `x` with logical axis names (a no-op outside `activation_sharding`)."""
  fn = _constraint.get()
  return x if fn is None else fn(x, axes)


def folded_keys(key: jax.Array, count: int) -> jax.Array:
  """The keys fold_in(key, i) for i = 0 .. count - 1, as one key array [count] (the same keys bit for bit).

  One vectorized threefry hash instead of one per key: a layer takes each projection's key from it,
  and XLA merges the identical hashes of one layer into one (CSE). On the GPU, every separate
  fold_in is a chain of some hundred scalar integer operations that priority fusion fuses one at
  a time, re-costing the growing fusion at every step (docs/performance-gpu.md, "Where the INT8
  compile time goes").
  """
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(count, dtype=jnp.uint32))


def param(key, shape, std, axes) -> nnx.Param:
  """An f32 parameter drawn from N(0, std²), with its logical axes for sharding."""
  return nnx.Param(std * jax.random.normal(key, shape, jnp.float32), logical_axes=axes)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis in f32: x / rms(x) * scale, or * (1 + scale) with `offset` (Gemma;
  the scale then starts at 0). The output has `dtype` (the activation dtype)."""

  def __init__(self, dim: int, eps: float, offset: bool = False, dtype: str = "bfloat16"):
    init = jnp.zeros if offset else jnp.ones
    self.scale = nnx.Param(init((dim,), jnp.float32), logical_axes=("norm",))
    self.eps, self.offset, self.dtype = eps, offset, dtype

  def __call__(self, x_BxSxD):
    return _rms_norm(x_BxSxD, self.scale[...], self.eps, self.offset, self.dtype)


@functools.partial(jax.checkpoint, static_argnums=(2, 3, 4))
def _rms_norm(x_BxSxD, scale_D, eps: float, offset: bool, dtype: str):
  """RMSNorm's f32 arithmetic, recomputed in the backward pass from its input (kept in the activation
  dtype) instead of saving its f32 intermediates for every layer."""
  x = x_BxSxD.astype(jnp.float32)
  x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  scale = 1.0 + scale_D if offset else scale_D
  return (x * scale).astype(dtype)


def gated(act: Callable, gate, up):
  """act(gate) * up, recomputed in the backward pass from `gate` and `up` (the two projections' outputs,
  which the backward pass needs anyway) instead of saving the activation's intermediates per layer."""
  return jax.checkpoint(lambda g, u: act(g) * u)(gate, up)


def yarn_mscale(factor: float, mscale: float) -> float:
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
  return inv_freq, yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)


def rope(x_BxSxNxH, theta: float, scaling: RopeScaling | None = None, positions_BxS: jax.Array | None = None):
  """Rotary position embedding (rotate-half form), computed in f32, at positions 0..S-1 or `positions_BxS`."""
  s, h = x_BxSxNxH.shape[1], x_BxSxNxH.shape[-1]
  inv_freq, magnitude = rope_frequencies(h, theta, scaling)
  if positions_BxS is None:
    angle_SxH2 = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(angle_SxH2)[None, :, None, :], jnp.sin(angle_SxH2)[None, :, None, :]
  else:
    angle_BxSxH2 = positions_BxS.astype(jnp.float32)[..., None] * inv_freq
    cos, sin = jnp.cos(angle_BxSxH2)[:, :, None, :], jnp.sin(angle_BxSxH2)[:, :, None, :]
  if magnitude != 1.0:
    cos, sin = cos * magnitude, sin * magnitude
  x = x_BxSxNxH.astype(jnp.float32)
  x1, x2 = x[..., : h // 2], x[..., h // 2 :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxSxNxH.dtype)


def attend(q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cfg: ModelConfig, cache, *, scale=None, window=None):
  """Causal attention (within `window` positions, self included, when given): over the S new
  positions themselves, or with a `cache.Step` over the L cached ones under its mask (XLA kernel)."""
  if cache is None:
    return jax.nn.dot_product_attention(
      q_BxSxNxH,
      k_BxLxKxH,
      v_BxLxKxH,
      is_causal=True,
      scale=scale,
      local_window_size=None if window is None else (window - 1, 0),
      implementation=cfg.attention_impl,
    )
  mask = cache.mask(window)
  return jax.nn.dot_product_attention(q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, mask=mask, scale=scale, implementation="xla")


class Block[C: ModelConfig](nnx.Module):
  """Llama block (pre-norm): x + attention(norm(x)), then + SwiGLU(norm(x)).

  Other families subclass it (s3r.model.blocks) and override the hooks: `_qk` (queries and keys
  before RoPE), `_attend` (the attention core), `_after` (a sublayer's output before the residual
  add) and `_ffn` (the feed-forward, which also returns the MoE auxiliary terms). `C` is the
  config class of the family."""

  PROJECTIONS: ClassVar[tuple[str, ...]] = PROJECTIONS
  TP_SPLIT: ClassVar[Mapping[str, str | None]] = _TP_SPLIT  # None: the weight is not split

  def __init__(self, cfg: C, key, layer: int = 0):
    self.cfg, self.layer = cfg, layer
    d, nh, kh = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    k = dict(zip(PROJECTIONS, jax.random.split(key, len(PROJECTIONS))))
    self.attn_norm = self._norm(d)
    self.q = param(k["q"], (d, nh), std, ("embed", "heads"))
    self.k = param(k["k"], (d, kh), std, ("embed", "kv_heads"))
    self.v = param(k["v"], (d, kh), std, ("embed", "kv_heads"))
    self.o = param(k["o"], (nh, d), out_std, ("heads", "embed"))
    self.mlp_norm = self._norm(d)
    self._init_ffn(k, std, out_std)

  def _norm(self, dim: int) -> RMSNorm:
    return RMSNorm(dim, self.cfg.norm_eps, dtype=self.cfg.act_dtype)

  def _init_ffn(self, k: dict, std: float, out_std: float):
    d, f = self.cfg.d_model, self.cfg.d_ff
    self.gate = param(k["gate"], (d, f), std, ("embed", "mlp"))
    self.up = param(k["up"], (d, f), std, ("embed", "mlp"))
    self.down = param(k["down"], (f, d), out_std, ("mlp", "embed"))

  def _proj(self, name: str, x, layer_key):
    key = None if layer_key is None else folded_keys(layer_key, len(self.PROJECTIONS))[self.PROJECTIONS.index(name)]
    tp = self.TP_SPLIT[name] if self.cfg.tp_partial_sums == "bf16" else None
    w = getattr(self, name)[...]
    return qmatmul(x, w, key=key, recipe=self.cfg.recipe, tp=tp, compute_dtype=self.cfg.act_dtype)

  def _qk(self, q_BxSxNxH, k_BxSxKxH):
    return q_BxSxNxH, k_BxSxKxH

  def _rope(self, x_BxSxNxH, positions_BxS=None, layer=None):
    return rope(x_BxSxNxH, self.cfg.rope_theta, self.cfg.rope_scaling, positions_BxS)

  def _attend(self, q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, cache=None, layer=None):
    # scores and probability-value products in the activation dtype (f32 softmax); "cudnn": fused flash attention.
    return attend(q_BxSxNxH, k_BxLxKxH, v_BxLxKxH, self.cfg, cache)

  def _after(self, name: str, y_BxSxD):
    return y_BxSxD

  @classmethod
  def cache_shapes(cls, cfg: C) -> dict[str, tuple[int, ...]]:
    """What generation caches per position of one layer (s3r.model.cache): name -> trailing shape."""
    return {"k": (cfg.n_kv_heads, cfg.head_dim), "v": (cfg.n_kv_heads, cfg.head_dim)}

  def _attention(self, h_BxSxD, layer_key, cache=None, layer=None):
    cfg = self.cfg
    b, s, _ = h_BxSxD.shape
    positions = None if cache is None else cache.positions_BxS
    q_BxSxNxH = self._proj("q", h_BxSxD, layer_key).reshape(b, s, cfg.n_heads, cfg.head_dim)
    k_BxSxKxH = self._proj("k", h_BxSxD, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    v_BxSxKxH = self._proj("v", h_BxSxD, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    q_BxSxNxH, k_BxSxKxH = self._qk(q_BxSxNxH, k_BxSxKxH)
    q_BxSxNxH = constrain(self._rope(q_BxSxNxH, positions, layer), ("batch", "seq", "act_heads", None))
    k_BxSxKxH = constrain(self._rope(k_BxSxKxH, positions, layer), ("batch", "seq", "act_kv_heads", None))
    v_BxSxKxH = constrain(v_BxSxKxH, ("batch", "seq", "act_kv_heads", None))
    if cache is not None:  # the new keys and values join the cached ones: [B, L, K, H]
      k_BxSxKxH, v_BxSxKxH = cache.write(layer, "k", k_BxSxKxH), cache.write(layer, "v", v_BxSxKxH)
    a_BxSxNxH = self._attend(q_BxSxNxH, k_BxSxKxH, v_BxSxKxH, cache, layer)
    return self._proj("o", a_BxSxNxH.reshape(b, s, -1), layer_key)

  def _act(self, gate_BxSxF):
    return jax.nn.silu(gate_BxSxF)

  def _ffn(self, h_BxSxD, layer_key):
    gate_BxSxF = self._proj("gate", h_BxSxD, layer_key)
    up_BxSxF = self._proj("up", h_BxSxD, layer_key)
    hidden_BxSxF = constrain(gated(self._act, gate_BxSxF, up_BxSxF), ("batch", "seq", "act_mlp"))
    return self._proj("down", hidden_BxSxF, layer_key), {}

  def __call__(self, x_BxSxD, layer_key, cache=None, *, layer=None):
    """(the block's output [B, S, D], MoE auxiliary terms: {} for a dense block). `cache`: a
    `cache.Step` during generation (the block attends over the cached positions and adds its own).
    `layer`: the block's layer index (default `self.layer`); a traced int32 when the block runs
    inside the decoder's scan over a stacked segment."""
    layer = self.layer if layer is None else layer
    y_BxSxD = self._after("attn", self._attention(self.attn_norm(x_BxSxD), layer_key, cache, layer))
    x_BxSxD = constrain(x_BxSxD + y_BxSxD, ("batch", "seq", "act_embed"))
    y_BxSxD, aux = self._ffn(self.mlp_norm(x_BxSxD), layer_key)
    return constrain(x_BxSxD + self._after("mlp", y_BxSxD), ("batch", "seq", "act_embed")), aux
