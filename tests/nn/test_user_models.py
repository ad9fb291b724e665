"""The `skip` patterns docs/flax.md gives for models users bring match the layer they mean, on models
whose layer names are not s3r's: an NNX model named as Flax's miniGPT tutorial names its layers
(docs_nnx/examples/minigpt: `embedding_layer`, `transformer_blocks` of `mha` and an `mlp` Sequential,
`output_layer`) and a Linen model named as nanodo's `TransformerDo` (attention `query`, `key`,
`value`, `attn_out_proj`; `Mlp` of two Dense; logits through `embed.attend`)."""

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import s3r

VOCAB, SEQ, D, HEADS, FF, BLOCKS = 32, 8, 16, 2, 32, 2
TOKENS = jax.random.randint(jax.random.key(1), (2, SEQ), 0, VOCAB)


# --- NNX, named as Flax's miniGPT tutorial ------------------------------------------------------------


class MiniGptBlock(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.mha = nnx.MultiHeadAttention(num_heads=HEADS, in_features=D, decode=False, rngs=rngs)
    self.layer_norm1 = nnx.LayerNorm(D, rngs=rngs)
    self.mlp = nnx.Sequential(nnx.Linear(D, FF, rngs=rngs), nnx.relu, nnx.Linear(FF, D, rngs=rngs))
    self.layer_norm2 = nnx.LayerNorm(D, rngs=rngs)

  def __call__(self, x):
    h = self.layer_norm1(x + self.mha(x, mask=nnx.make_causal_mask(x[..., 0])))
    return self.layer_norm2(h + self.mlp(h))


class TokenAndPositionEmbedding(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.token_emb = nnx.Embed(VOCAB, D, rngs=rngs)
    self.pos_emb = nnx.Embed(SEQ, D, rngs=rngs)

  def __call__(self, tokens):
    return self.token_emb(tokens) + self.pos_emb(jnp.arange(tokens.shape[1])[None])


class MiniGpt(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.embedding_layer = TokenAndPositionEmbedding(rngs=rngs)
    self.transformer_blocks = nnx.Sequential(*[MiniGptBlock(rngs=rngs) for _ in range(BLOCKS)])
    self.output_layer = nnx.Linear(D, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    return self.output_layer(self.transformer_blocks(self.embedding_layer(tokens)))


def _nnx_projections(model) -> dict[str, bool]:
  """{path: quantized?} of every Linear / LinearGeneral of the model."""
  layers = [(p, m) for p, m in nnx.iter_modules(model) if isinstance(m, nnx.Linear | nnx.LinearGeneral)]
  return {"/".join(map(str, p)): isinstance(m.dot_general, s3r.nn.NnxDotGeneral) for p, m in layers}


def test_the_documented_nnx_skip_keeps_exactly_the_minigpt_logits_projection_in_float():
  model = MiniGpt(rngs=nnx.Rngs(0))
  s3r.nn.quantize(model, "s3r_ec_dx", skip=("output_layer",), rngs=1)  # docs/flax.md
  quantized = _nnx_projections(model)
  assert len(quantized) == BLOCKS * 6 + 1  # query, key, value, out, two mlp Linears per block; the logits
  assert {p for p, q in quantized.items() if not q} == {"output_layer"}
  assert quantized["transformer_blocks/layers/0/mha/query"] and quantized["transformer_blocks/layers/1/mlp/layers/2"]

  grads = nnx.jit(nnx.grad(lambda m: jnp.mean(m(TOKENS) ** 2)))(model)  # one gradient through the quantized model
  assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(nnx.state(grads, nnx.Param)))


def test_a_glob_skips_every_minigpt_mlp_layer_and_nothing_else():
  model = s3r.nn.quantize(MiniGpt(rngs=nnx.Rngs(0)), "s3r_ec_dx", skip=("*/mlp/*",), rngs=1)
  kept = {p for p, q in _nnx_projections(model).items() if not q}
  assert kept == {f"transformer_blocks/layers/{b}/mlp/layers/{i}" for b in range(BLOCKS) for i in (0, 2)}


def test_a_skip_written_for_another_model_names_the_minigpt_layers_there_are():
  with pytest.raises(ValueError, match=r"'lm_head', 'router' match no .*output_layer"):
    s3r.nn.quantize(MiniGpt(rngs=nnx.Rngs(0)), "s3r_ec_dx", skip=("lm_head", "router"), rngs=1)


# --- Linen, named as nanodo's TransformerDo -------------------------------------------------------------


class CausalAttn(nn.Module):
  @nn.compact
  def __call__(self, x):
    heads = partial(nn.DenseGeneral, features=(HEADS, D // HEADS), use_bias=False)
    q, k, v = heads(name="query")(x), heads(name="key")(x), heads(name="value")(x)
    mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    att = jnp.where(mask, jnp.einsum("bqhd,bkhd->bhqk", q, k) / (D // HEADS) ** 0.5, -1e9)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v)
    return nn.DenseGeneral(D, axis=(-2, -1), use_bias=False, name="attn_out_proj")(out)


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, use_bias=False)(jax.nn.gelu(nn.Dense(FF, use_bias=False)(x)))


class TBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + CausalAttn()(nn.LayerNorm(use_bias=False)(x))
    return x + Mlp()(nn.LayerNorm(use_bias=False)(x))


class TransformerDo(nn.Module):
  def setup(self):
    self.embed = nn.Embed(VOCAB, D)
    self.pos_embed = nn.Embed(SEQ, D)
    self.blocks = [TBlock() for _ in range(BLOCKS)]
    self.out_ln = nn.LayerNorm(use_bias=False)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1])[None])
    for block in self.blocks:
      x = block(x)
    return self.embed.attend(self.out_ln(x))  # tied logits: a gather's table, never a Dense


def _linen_projections(q, variables) -> dict[str, bool]:
  """{path: quantized?} of every Dense / DenseGeneral call of one apply through `q`."""
  seen = {}

  def record(next_fun, args, kwargs, context):  # inside q's interceptor: sees the dot_general it set
    if context.method_name == "__call__" and isinstance(context.module, nn.Dense | nn.DenseGeneral):
      seen["/".join(context.module.path)] = context.module.dot_general is not None
    return next_fun(*args, **kwargs)

  with q.intercept(), nn.intercept_methods(record):
    q.module.apply(variables, TOKENS)
  return seen


def test_the_documented_linen_calls_quantize_every_nanodo_projection_but_the_skipped_ones():
  module = TransformerDo()
  variables = module.init(jax.random.key(0), TOKENS)
  every = _linen_projections(s3r.nn.quantize(module, "s3r_ec_dx"), variables)  # docs/flax.md
  assert len(every) == BLOCKS * 6 and all(every.values())  # the tied logits (embed.attend) are not a projection
  kept = _linen_projections(s3r.nn.quantize(module, "s3r_ec_dx", skip=("attn_out_proj",)), variables)
  assert {p for p, q in kept.items() if not q} == {f"blocks_{i}/CausalAttn_0/attn_out_proj" for i in range(BLOCKS)}


def test_the_readme_lm_head_skip_is_refused_on_nanodo_naming_its_layers():
  q = s3r.nn.quantize(TransformerDo(), "s3r_ec_dx", skip=("lm_head",))
  with pytest.raises(ValueError, match=r"'lm_head' match no .*blocks_0/CausalAttn_0/query"):
    q.init(jax.random.key(0), TOKENS)
