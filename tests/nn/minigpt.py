"""A miniGPT test fixture written the way Flax NNX's miniGPT tutorial writes its model.

Token and position embeddings, post-norm transformer blocks of `nnx.MultiHeadAttention` with a causal
mask and a two-layer `nnx.Linear` MLP, an output projection, every kernel annotated for a
("batch", "model") mesh with `nnx.with_partitioning`. Built under `jax.set_mesh` of a mesh with
Explicit axes, its parameters are created sharded and every activation carries its sharding in its
type. No dropout (the tests compare gradients across meshes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

VOCAB, MAXLEN, EMBED, HEADS, FF, BLOCKS = 64, 16, 32, 4, 64, 2


def explicit_mesh(batch: int, model: int) -> jax.sharding.Mesh:
  """A ("batch", "model") mesh over the first batch*model devices, both axes Explicit."""
  return jax.make_mesh(
    (batch, model), ("batch", "model"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[: batch * model]
  )


def _sharded(init, *names):
  return nnx.with_partitioning(init, names)


class TransformerBlock(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    xavier, zeros = nnx.initializers.xavier_uniform(), nnx.initializers.zeros_init()
    norm = dict(epsilon=1e-6, scale_init=_sharded(nnx.initializers.ones_init(), None), bias_init=_sharded(zeros, None))
    column = dict(kernel_init=_sharded(xavier, None, "model"), bias_init=_sharded(zeros, "model"))
    self.mha = nnx.MultiHeadAttention(
      num_heads=HEADS,
      in_features=EMBED,
      kernel_init=_sharded(xavier, None, "model"),
      bias_init=_sharded(zeros, "model"),
      decode=False,
      rngs=rngs,
    )
    self.layer_norm1 = nnx.LayerNorm(EMBED, **norm, rngs=rngs)
    self.linear1 = nnx.Linear(EMBED, FF, **column, rngs=rngs)
    row = dict(kernel_init=_sharded(xavier, "model", None), bias_init=_sharded(zeros, None))
    self.linear2 = nnx.Linear(FF, EMBED, **row, rngs=rngs)
    self.layer_norm2 = nnx.LayerNorm(EMBED, **norm, rngs=rngs)

  def __call__(self, inputs):
    seq = inputs.shape[1]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    out1 = self.layer_norm1(inputs + self.mha(inputs, mask=mask))
    ffn = self.linear2(nnx.relu(self.linear1(out1)))
    return self.layer_norm2(out1 + ffn)


class MiniGPT(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    table = _sharded(nnx.initializers.normal(1.0), None, "model")
    self.token_emb = nnx.Embed(VOCAB, EMBED, embedding_init=table, rngs=rngs)
    self.pos_emb = nnx.Embed(MAXLEN, EMBED, embedding_init=table, rngs=rngs)
    self.blocks = nnx.List([TransformerBlock(rngs=rngs) for _ in range(BLOCKS)])
    self.output_layer = nnx.Linear(
      EMBED,
      VOCAB,
      kernel_init=_sharded(nnx.initializers.xavier_uniform(), None, "model"),
      bias_init=_sharded(nnx.initializers.zeros_init(), "model"),
      rngs=rngs,
    )

  def __call__(self, tokens):
    positions = jnp.arange(tokens.shape[1])[None, :]
    act = P("batch", None, None) if _explicit() else None  # the gather's output sharding, as nnx.Embed takes it
    x = self.token_emb(tokens, out_sharding=act) + self.pos_emb(positions, out_sharding=None if act is None else P())
    for block in self.blocks:
      x = block(x)
    return self.output_layer(x, out_sharding=act)  # logits whole along the vocabulary for the loss


def _explicit() -> bool:
  return bool(jax.sharding.get_abstract_mesh().explicit_axes)


def loss_fn(model: MiniGPT, inputs, targets):
  logits = model(inputs)
  if _explicit():  # the bias (sharded over "model") shards the logits again
    logits = jax.sharding.reshard(logits, P("batch", None, None))
  return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=targets).mean()


def batch(batch_size: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
  """(inputs, targets) [batch_size, MAXLEN]: a repeating pattern, so that a few steps lower the loss."""
  start = jax.random.randint(jax.random.key(seed), (batch_size, 1), 0, VOCAB)
  tokens = (start + jnp.arange(MAXLEN + 1)[None, :] * 3) % VOCAB
  return tokens[:, :-1], tokens[:, 1:]


def batch_spec() -> P:
  return P("batch", None)
