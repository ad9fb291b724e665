"""A small causal transformer written the way Equinox writes models (eqx.nn layers, one example per
call, `jax.vmap` over tokens inside and over examples outside), with no s3r in it: the model of
`python -m benchmarks eqx` and the fixture of test_equinox.py, both of which quantize it through
`s3r.nn.quantize_fn`."""

import equinox as eqx
import jax
import jax.numpy as jnp


class Block(eqx.Module):
  norm1: eqx.nn.LayerNorm
  attn: eqx.nn.MultiheadAttention
  norm2: eqx.nn.LayerNorm
  mlp_in: eqx.nn.Linear
  mlp_out: eqx.nn.Linear

  def __init__(self, dim: int, heads: int, hidden: int, *, key):
    k_attn, k_in, k_out = jax.random.split(key, 3)
    self.norm1 = eqx.nn.LayerNorm(dim)
    self.attn = eqx.nn.MultiheadAttention(heads, dim, key=k_attn)
    self.norm2 = eqx.nn.LayerNorm(dim)
    self.mlp_in = eqx.nn.Linear(dim, hidden, key=k_in)
    self.mlp_out = eqx.nn.Linear(hidden, dim, key=k_out)

  def __call__(self, x_SxD):
    seq = x_SxD.shape[0]
    h = jax.vmap(self.norm1)(x_SxD)
    x_SxD = x_SxD + self.attn(h, h, h, mask=jnp.tril(jnp.ones((seq, seq), bool)))
    h = jax.vmap(self.norm2)(x_SxD)
    return x_SxD + jax.vmap(lambda t: self.mlp_out(jax.nn.gelu(self.mlp_in(t))))(h)


class Transformer(eqx.Module):
  embed: eqx.nn.Embedding
  blocks: list[Block]
  norm: eqx.nn.LayerNorm
  head: eqx.nn.Linear

  def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, *, key):
    k_embed, k_head, *k_blocks = jax.random.split(key, 2 + layers)
    self.embed = eqx.nn.Embedding(vocab, dim, key=k_embed)
    self.blocks = [Block(dim, heads, hidden, key=k) for k in k_blocks]
    self.norm = eqx.nn.LayerNorm(dim)
    self.head = eqx.nn.Linear(dim, vocab, use_bias=False, key=k_head)

  def __call__(self, tokens_S):
    x = jax.vmap(self.embed)(tokens_S)
    for block in self.blocks:
      x = block(x)
    return jax.vmap(self.head)(jax.vmap(self.norm)(x))


def loss(model: Transformer, tokens_BxS):
  """Next-token cross-entropy of a batch, the model applied per example under jax.vmap."""
  logits = jax.vmap(model)(tokens_BxS[:, :-1])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  return -jnp.mean(jnp.take_along_axis(logp, tokens_BxS[:, 1:, None], axis=-1))
