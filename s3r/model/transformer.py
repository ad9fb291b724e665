"""Llama-style decoder in Flax NNX whose block projections are INT8 `qmatmul`s.

Dimension letters in tensor names:
  B batch, S sequence, D model width, N query heads, K key/value heads, H head dim,
  F SwiGLU hidden width, V vocabulary.

Numerics (ALGORITHM.md §2): the seven projections of every block (q, k, v, o, gate, up,
down) go through `s3r.quant.qmatmul` with the config's recipe; the token embedding, the
logits projection, the attention score and probability-value products, RMSNorm, RoPE and
softmax stay in bf16 (norm, RoPE and softmax math in f32). Parameters are f32 master
weights; activations are bf16; logits are f32.

Randomness: one step key enters `Transformer.__call__`; the key of projection j of layer l
is `fold_in(fold_in(step_key, l), j)`, so every projection of every step gets its own key.

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
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.model.config import ModelConfig
from s3r.quant import qmatmul, recipe as get_recipe

ACT_DTYPE = jnp.bfloat16
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # index j of the per-projection key
# Megatron-style split of each projection's weight over the "tensor" mesh axis (s3r.train.sharding
# RULES): column-parallel W [D, F] split along its outputs, row-parallel along its inputs.
_TP_SPLIT = {"q": "column", "k": "column", "v": "column", "o": "row", "gate": "column", "up": "column", "down": "row"}

_constraint: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("s3r_activation_constraint",
                                                                              default=None)
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
  def __init__(self, dim: int, eps: float):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x_BxSxD):
    x = x_BxSxD.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    return (x * self.scale[...]).astype(ACT_DTYPE)


def rope(x_BxSxNxH, theta: float):
  """Rotary position embedding (rotate-half form), computed in f32."""
  s, h = x_BxSxNxH.shape[1], x_BxSxNxH.shape[-1]
  inv_freq = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
  angle_SxH2 = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle_SxH2)[None, :, None, :], jnp.sin(angle_SxH2)[None, :, None, :]
  x = x_BxSxNxH.astype(jnp.float32)
  x1, x2 = x[..., : h // 2], x[..., h // 2 :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxSxNxH.dtype)


class Block(nnx.Module):
  """Pre-norm block: x + attention(norm(x)), then + SwiGLU(norm(x))."""

  def __init__(self, cfg: ModelConfig, key):
    d, nh, kh, f = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    k = dict(zip(PROJECTIONS, jax.random.split(key, len(PROJECTIONS))))
    self.attn_norm = RMSNorm(d, cfg.norm_eps)
    self.q = _param(k["q"], (d, nh), std, ("embed", "heads"))
    self.k = _param(k["k"], (d, kh), std, ("embed", "kv_heads"))
    self.v = _param(k["v"], (d, kh), std, ("embed", "kv_heads"))
    self.o = _param(k["o"], (nh, d), out_std, ("heads", "embed"))
    self.mlp_norm = RMSNorm(d, cfg.norm_eps)
    self.gate = _param(k["gate"], (d, f), std, ("embed", "mlp"))
    self.up = _param(k["up"], (d, f), std, ("embed", "mlp"))
    self.down = _param(k["down"], (f, d), out_std, ("mlp", "embed"))
    self.cfg = cfg

  def _proj(self, name: str, x, layer_key):
    key = None if layer_key is None else jax.random.fold_in(layer_key, PROJECTIONS.index(name))
    override = _projection.get()
    if override is not None:
      return override(name, x, getattr(self, name)[...], key=key, recipe=self.cfg.recipe)
    tp = _TP_SPLIT[name] if self.cfg.tp_partial_sums == "bf16" else None
    return qmatmul(x, getattr(self, name)[...], key=key, recipe=self.cfg.recipe, tp=tp)

  def __call__(self, x_BxSxD, layer_key):
    cfg = self.cfg
    b, s, _ = x_BxSxD.shape
    h = self.attn_norm(x_BxSxD)
    q_BxSxNxH = self._proj("q", h, layer_key).reshape(b, s, cfg.n_heads, cfg.head_dim)
    k_BxSxKxH = self._proj("k", h, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    v_BxSxKxH = self._proj("v", h, layer_key).reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    q_BxSxNxH = constrain(rope(q_BxSxNxH, cfg.rope_theta), ("batch", "seq", "act_heads", None))
    k_BxSxKxH = constrain(rope(k_BxSxKxH, cfg.rope_theta), ("batch", "seq", "act_kv_heads", None))
    v_BxSxKxH = constrain(v_BxSxKxH, ("batch", "seq", "act_kv_heads", None))
    # bf16 scores and probability-value products (f32 softmax); flash attention where available.
    a_BxSxNxH = jax.nn.dot_product_attention(q_BxSxNxH, k_BxSxKxH, v_BxSxKxH, is_causal=True)
    a_BxSxNH = a_BxSxNxH.reshape(b, s, cfg.n_heads * cfg.head_dim)
    x_BxSxD = constrain(x_BxSxD + self._proj("o", a_BxSxNH, layer_key), ("batch", "seq", "act_embed"))

    h = self.mlp_norm(x_BxSxD)
    gate_BxSxF = self._proj("gate", h, layer_key)
    up_BxSxF = self._proj("up", h, layer_key)
    hidden_BxSxF = constrain(jax.nn.silu(gate_BxSxF) * up_BxSxF, ("batch", "seq", "act_mlp"))
    return constrain(x_BxSxD + self._proj("down", hidden_BxSxF, layer_key), ("batch", "seq", "act_embed"))


class Transformer(nnx.Module):
  """Token embedding, `n_layers` blocks, final RMSNorm, untied logits projection."""

  def __init__(self, cfg: ModelConfig, *, key: jax.Array):
    embed_key, blocks_key, out_key = jax.random.split(key, 3)
    self.embed = _param(embed_key, (cfg.vocab_size, cfg.d_model), cfg.init_std, ("vocab", "embed"))
    self.blocks = nnx.List([Block(cfg, k) for k in jax.random.split(blocks_key, cfg.n_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    self.out = _param(out_key, (cfg.d_model, cfg.vocab_size), cfg.init_std, ("embed", "vocab"))
    self.cfg = cfg

  def __call__(self, tokens_BxS: jax.Array, *, key: jax.Array | None = None,
               probes: list | None = None) -> jax.Array:
    """Returns f32 logits [B, S, V]. `key` (one per step) is required by stochastic recipes.

    `probes` (diagnostics): one [B, S, D] array per block, added to the block's input; the
    gradient with respect to a zero probe is the activation gradient entering that block.
    """
    cfg = self.cfg
    if tokens_BxS.shape[1] > cfg.max_seq_len:
      raise ValueError(f"sequence length {tokens_BxS.shape[1]} exceeds max_seq_len {cfg.max_seq_len}")
    if key is None and get_recipe(cfg.recipe).stochastic:
      raise ValueError(f"recipe {cfg.recipe!r} is stochastic: pass a step key")
    x_BxSxD = self.embed[...].astype(ACT_DTYPE)[tokens_BxS]
    x_BxSxD = constrain(x_BxSxD, ("batch", "seq", "act_embed"))
    for layer, block in enumerate(self.blocks):
      layer_key = None if key is None else jax.random.fold_in(key, layer)
      if probes is not None:
        x_BxSxD = x_BxSxD + probes[layer].astype(x_BxSxD.dtype)
      if cfg.remat:
        x_BxSxD = nnx.remat(lambda blk, x, k: blk(x, k))(block, x_BxSxD, layer_key)
      else:
        x_BxSxD = block(x_BxSxD, layer_key)
    h_BxSxD = self.final_norm(x_BxSxD)
    logits_BxSxV = jnp.dot(h_BxSxD, self.out[...].astype(ACT_DTYPE), preferred_element_type=jnp.float32)
    return constrain(logits_BxSxV, ("batch", "seq", "act_vocab"))


# Functional interface: parameters as a plain nested dict of f32 arrays (what the trainer,
# the optimizer and the checkpoints see), the module structure as a static graphdef.


def graphdef(cfg: ModelConfig) -> nnx.GraphDef:
  """The static structure of the model (no parameters are allocated)."""
  return nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, key=jax.random.key(0))))


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
  """Freshly initialized parameters: a nested dict of f32 arrays (jit-able)."""
  return nnx.to_pure_dict(nnx.state(Transformer(cfg, key=key)))


def apply(graphdef: nnx.GraphDef, params: dict, tokens_BxS: jax.Array, *, key: jax.Array | None,
          probes: list | None = None) -> jax.Array:
  """f32 logits [B, S, V] of the model `graphdef` with parameters `params` (see Transformer)."""
  return nnx.merge(graphdef, params)(tokens_BxS, key=key, probes=probes)


def logical_axes(cfg: ModelConfig) -> dict:
  """The params tree with each leaf replaced by a PartitionSpec of logical axis names."""
  state = jax.eval_shape(lambda: nnx.split(Transformer(cfg, key=jax.random.key(0)))[1])
  is_var = lambda x: isinstance(x, nnx.Variable)
  specs = jax.tree.map(lambda v: jax.sharding.PartitionSpec(*v.get_metadata()["logical_axes"]), state,
                       is_leaf=is_var)
  return nnx.to_pure_dict(specs)
