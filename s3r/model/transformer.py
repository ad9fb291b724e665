"""The decoder in Flax NNX whose block projections are INT8 `qmatmul`s: the model and its
functional interface. The blocks live in `s3r.model.layers` (the shared pieces and the Llama
block) and in each family's module (s3r.model.families), whose record names its block.

Dimension letters in tensor names:
  B batch, S sequence, D model width, N query heads, K key/value heads, H head dim,
  F gated FFN hidden width, V vocabulary.

Numerics (docs/algorithm.md §2): every projection of every block (Llama: q, k, v, o, gate, up,
down) goes through `s3r.quant.qmatmul` with the config's recipe; the token embedding, the
logits projection, the attention score and probability-value products, RMSNorm, RoPE and
softmax stay in the activation dtype (norm, RoPE and softmax math in f32). Parameters are f32
master weights; activations are bf16, or f32 with `act_dtype="float32"` (every float matmul then
at full f32 precision); logits are f32.

Layers: the blocks are stacked (s3r.model.stack): each segment (all layers; the MoE families'
leading dense layers form a segment of their own) is one block module whose parameters have a
leading layer axis. With `scan_layers` (the default) a segment runs as one `jax.lax.scan`, so XLA
compiles one block whatever the depth; `scan_layers=False` runs the same parameters in a Python
loop, one block per layer (debugging, tests that count operations per layer). Both give the same
results. `remat` rematerializes each layer.

Extension: `Transformer(cfg, key=..., block=B)` (and `graphdef(cfg, block=B)`) builds the model with B,
a subclass of the family's block, in place of that block: B can observe or alter what every block
computes (diagnostics, fault injection) while the decoder runs as usual, scanned or unrolled. The
parameters are the family's own.

Randomness: one step key enters `Transformer.__call__`; the key of projection j of layer l
is `fold_in(fold_in(step_key, l), j)` (j: index in the block's PROJECTIONS), so every
projection of every step gets its own key, scanned or not.

Sharding: every parameter carries `logical_axes` metadata, and activations are tagged with
logical names through `constrain`; `s3r.train.step.sharding` maps both onto the device mesh.
Under a mesh with a "tensor" axis, `tp_partial_sums="bf16"` (the default) makes the GEMM that
contracts a projection's tensor-split dimension round each shard's output to bf16 before the
cross-shard sum, as the paper's TPU runs do; "int32" keeps XLA's exact int32 partial sums.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.model import families, stack
from s3r.model.config import ModelConfig
from s3r.model.layers import Block, RMSNorm, constrain, param


def block_class(cfg: ModelConfig) -> type[Block]:
  """The block of the config's family (s3r.model.families; a subclass of a family's config gets that
  family's block)."""
  return families.family_of(cfg).block


class Transformer(nnx.Module):
  """Token embedding, `n_layers` blocks of the config's family (stacked by segment, see
  s3r.model.stack), final RMSNorm, logits projection (untied, or the embedding's transpose with
  `tie_embeddings`; Gemma 3 scales the embedding by sqrt(D))."""

  def __init__(self, cfg: ModelConfig, *, key: jax.Array, block: type[Block] | None = None):
    """`block`: the block class, a subclass of the family's (default: the family's own; see the module doc)."""
    if block is not None and not (isinstance(block, type) and issubclass(block, block_class(cfg))):
      raise ValueError(f"block: must be a subclass of {block_class(cfg).__name__}, got {block!r}")
    embed_key, blocks_key, out_key = jax.random.split(key, 3)
    self.embed = param(embed_key, (cfg.vocab_size, cfg.d_model), cfg.init_std, ("vocab", "embed"))
    layer_keys = jax.random.split(blocks_key, cfg.n_layers)
    for seg in stack.segments(cfg):
      setattr(self, seg.name, stacked_block(cfg, seg, layer_keys[seg.start : seg.start + seg.count], block))
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, offset=cfg.norm_offset, dtype=cfg.act_dtype)
    if not cfg.tie_embeddings:
      self.out = param(out_key, (cfg.d_model, cfg.vocab_size), cfg.init_std, ("embed", "vocab"))
    self.cfg = cfg

  def __call__(
    self,
    tokens_BxS: jax.Array,
    *,
    key: jax.Array | None = None,
    aux: list | None = None,
    cache=None,
  ) -> jax.Array:
    """Returns f32 logits [B, S, V]. `key` (one per step) is required by stochastic recipes.

    `aux`: a list that receives each MoE layer's auxiliary dict (load_balance_loss, dropped_fraction).
    `cache`: a `s3r.model.cache.Step` (generation): the tokens sit at its positions and attend
    over its cached keys and values, which it receives (see s3r.model.generation).
    """
    cfg = self.cfg
    if tokens_BxS.shape[1] > cfg.max_seq_len:
      raise ValueError(f"sequence length {tokens_BxS.shape[1]} exceeds max_seq_len {cfg.max_seq_len}")
    if key is None and cfg.recipe.stochastic:
      raise ValueError(f"recipe {cfg.recipe.name!r} is stochastic: pass a step key")
    with float32_matmuls(cfg):
      return self._forward(tokens_BxS, key, aux, cache)

  def _forward(self, tokens_BxS, key, aux, cache):
    cfg, dt = self.cfg, self.cfg.act_dtype
    x_BxSxD = self.embed[...].astype(dt)[tokens_BxS]
    if cfg.embed_scale:
      x_BxSxD = x_BxSxD * jnp.asarray(math.sqrt(cfg.d_model), dt)
    x_BxSxD = constrain(x_BxSxD, ("batch", "seq", "act_embed"))
    run = scan_segment if cfg.scan_layers else loop_segment
    for seg in stack.segments(cfg):
      x_BxSxD, per_layer = run(getattr(self, seg.name), seg, x_BxSxD, key, cache)
      if aux is not None:
        aux.extend(a for a in per_layer if a)
    h_BxSxD = self.final_norm(x_BxSxD)
    w_DxV = self.embed[...].T if cfg.tie_embeddings else self.out[...]
    logits_BxSxV = jnp.dot(h_BxSxD, w_DxV.astype(dt), preferred_element_type=jnp.float32)
    return constrain(logits_BxSxV, ("batch", "seq", "act_vocab"))


def stacked_block(cfg: ModelConfig, seg: stack.Segment, keys: jax.Array, block: type[Block] | None = None) -> Block:
  """One block module of `cfg`'s family (of class `block`, default the family's) for the layers of `seg`,
  its parameters stacked over them (row i initialized from keys[i], as an unstacked block of layer
  seg.start + i would be)."""
  cls = block or block_class(cfg)
  make = lambda k: cls(cfg, k, seg.start)
  gdef = nnx.graphdef(nnx.eval_shape(lambda: make(keys[0])))
  return nnx.merge(gdef, jax.vmap(lambda k: nnx.state(make(k)))(keys))


def _layer_call(gdef: nnx.GraphDef, cfg: ModelConfig, cache):
  """f(state, x, layer_key, layer) -> (x, aux): one layer of a segment, rematerialized with `remat`."""

  def call(state, x_BxSxD, layer_key, layer):
    return nnx.merge(gdef, state)(x_BxSxD, layer_key, cache, layer=layer)

  return jax.checkpoint(call) if cfg.remat and cache is None else call


def scan_segment(block: Block, seg: stack.Segment, x_BxSxD, key, cache):
  """(output, [aux of each layer]) of the segment's layers as one `jax.lax.scan` over the stacked
  parameters (a generation cache rides in the carry, written at the traced layer index)."""
  gdef, state = nnx.split(block)
  call = _layer_call(gdef, block.cfg, cache)
  layers = jnp.arange(seg.start, seg.start + seg.count, dtype=jnp.int32)

  def body(carry, xs):
    x, entries = carry
    st, layer = xs
    if cache is not None:
      cache.set_entries(entries)
    x, aux = call(st, x, None if key is None else jax.random.fold_in(key, layer), layer)
    return (x, None if cache is None else cache.entries()), aux

  entries = None if cache is None else cache.entries()
  (x_BxSxD, entries), aux_N = jax.lax.scan(body, (x_BxSxD, entries), (state, layers))
  if cache is not None:
    cache.set_entries(entries)
  return x_BxSxD, [jax.tree.map(lambda a, i=i: a[i], aux_N) for i in range(seg.count)]


def loop_segment(block: Block, seg: stack.Segment, x_BxSxD, key, cache):
  """(output, [aux of each layer]) of the segment's layers in a Python loop (one traced block per layer)."""
  gdef, state = nnx.split(block)
  call = _layer_call(gdef, block.cfg, cache)
  per_layer = []
  for i in range(seg.count):
    layer = seg.start + i
    layer_key = None if key is None else jax.random.fold_in(key, layer)
    x_BxSxD, aux = call(jax.tree.map(lambda a, i=i: a[i], state), x_BxSxD, layer_key, layer)
    per_layer.append(aux)
  return x_BxSxD, per_layer


def float32_matmuls(cfg: ModelConfig):
  """With float32 activations, a context in which every float matmul traced runs at full f32
  precision (no TF32 or bf16 passes on accelerators); a no-op with bf16 activations."""
  return jax.default_matmul_precision("highest") if cfg.act_dtype == "float32" else contextlib.nullcontext()


# Functional interface: parameters as a plain nested dict of f32 arrays (what the trainer,
# the optimizer and the checkpoints see), the module structure as a static graphdef.


def graphdef(cfg: ModelConfig, *, block: type[Block] | None = None) -> nnx.GraphDef:
  """The static structure of the model (no parameters are allocated); `block` as in `Transformer`."""
  return nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, key=jax.random.key(0), block=block)))


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
  """Freshly initialized parameters: a nested dict of f32 arrays (jit-able)."""
  return nnx.to_pure_dict(nnx.state(Transformer(cfg, key=key)))


def apply(graphdef: nnx.GraphDef, params: dict, tokens_BxS: jax.Array, *, key: jax.Array | None) -> jax.Array:
  """f32 logits [B, S, V] of the model `graphdef` with parameters `params` (see Transformer)."""
  return nnx.merge(graphdef, params)(tokens_BxS, key=key)


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
  specs = nnx.to_pure_dict(
    jax.tree.map(lambda v: jax.sharding.PartitionSpec(*v.get_metadata()["logical_axes"]), state, is_leaf=is_var)
  )
  for seg in stack.segments(cfg):  # the layer axis of a stacked segment is not sharded
    specs[seg.name] = jax.tree.map(
      lambda p: jax.sharding.PartitionSpec(None, *p),
      specs[seg.name],
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )
  return specs
