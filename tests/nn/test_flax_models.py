"""Flax's own attention modules and small Flax-example-style transformers train through s3r."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import s3r
import s3r.nn as snn

# The default suite trains the unquantized baseline, the per-token shared thresholds and the recipe
# users train with; the adapters route every recipe through the same qmatmul call (whose numerics
# tests/quant checks per recipe), so the other recipes, which compile as many programs again, run
# with `-m slow`.
CORE_RECIPES = ("bf16", "s3r", "s3r_ec_dx")
EVERY_RECIPE = [r if r in CORE_RECIPES else pytest.param(r, marks=pytest.mark.slow) for r in s3r.RECIPES]

V, D, H, B, S, STEPS = 32, 16, 2, 2, 8, 4
TOKENS = jax.random.randint(jax.random.key(0), (B, S + 1), 0, V)


def _xent(logits, targets):
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def _train_linen(module, recipe_apply, steps=STEPS, lr=1e-2):
  """Adam on one batch; returns the losses. `recipe_apply(variables, inputs, rngs)` runs the model."""
  variables = module.init(jax.random.key(1), TOKENS[:, :-1])
  params, opt = variables["params"], optax.adam(lr)
  state = opt.init(params)

  @jax.jit
  def step(params, state, key):
    loss, g = jax.value_and_grad(
      lambda p: _xent(recipe_apply({"params": p}, TOKENS[:, :-1], {"quant": key}), TOKENS[:, 1:])
    )(params)
    updates, state = opt.update(g, state)
    return optax.apply_updates(params, updates), state, loss

  losses = []
  for i in range(steps):
    params, state, loss = step(params, state, jax.random.key(100 + i))
    losses.append(float(loss))
  return losses


def _train_nnx(model, steps=STEPS, lr=1e-2):
  opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    loss, g = nnx.value_and_grad(lambda m: _xent(m(TOKENS[:, :-1]), TOKENS[:, 1:]))(model)
    opt.update(model, g)
    return loss

  return [float(step(model, opt)) for _ in range(steps)]


def _decreases(losses):
  assert np.isfinite(losses).all(), losses
  assert losses[-1] < losses[0], losses


class LinenMha(nn.Module):
  recipe: str

  @nn.compact
  def __call__(self, tokens):
    dg = functools.partial(snn.LinenDotGeneral, recipe=self.recipe)
    x = nn.Embed(V, D)(tokens)
    attn = nn.MultiHeadDotProductAttention(num_heads=H, qkv_dot_general_cls=dg, out_dot_general_cls=dg)
    x = x + jnp.asarray(attn(x, mask=nn.make_causal_mask(tokens)))
    return nn.Dense(V)(x)


def test_linen_multi_head_attention_trains_with_s3r_ec_dx():
  module = LinenMha("s3r_ec_dx")
  _decreases(_train_linen(module, lambda v, x, rngs: module.apply(v, x, rngs=rngs)))


class NnxMha(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Embed(V, D, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=H, in_features=D, decode=False, rngs=rngs)
    self.lm_head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    return self.lm_head(x + self.attn(x, mask=nnx.make_causal_mask(tokens)))


def test_nnx_multi_head_attention_trains_with_s3r_ec_dx():
  model = snn.quantize(NnxMha(nnx.Rngs(0)), "s3r_ec_dx", skip=("lm_head",), rngs=1)
  assert all(
    isinstance(getattr(model.attn, n).dot_general, snn.NnxDotGeneral) for n in ("query", "key", "value", "out")
  )
  _decreases(_train_nnx(model))


# --- small transformers, written as Flax's examples write them --------------------------------


class LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    x = x + nn.MultiHeadDotProductAttention(num_heads=H)(nn.LayerNorm()(x), mask=mask)
    h = nn.DenseGeneral((2, D), name="up")(nn.LayerNorm()(x))  # a two-axis projection, contracted back
    return x + nn.DenseGeneral(D, axis=(-2, -1), name="down")(nn.gelu(h))


class LinenLm(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, D, name="embed")
    x = embed(tokens)
    for i in range(2):
      x = LinenBlock(name=f"block_{i}")(x, nn.make_causal_mask(tokens))
    return embed.attend(nn.LayerNorm()(x))


class NnxBlock(nnx.Module):
  def __init__(self, rngs):
    self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=H, in_features=D, decode=False, rngs=rngs)
    self.up = nnx.Einsum("bsd,dhf->bshf", (D, 2, D), rngs=rngs)
    self.down = nnx.LinearGeneral((2, D), D, axis=(-2, -1), rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.ln1(x), mask=nnx.make_causal_mask(x[..., 0]))
    return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class NnxLm(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Embed(V, D, rngs=rngs)

    @nnx.split_rngs(splits=2)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return NnxBlock(rngs)

    self.blocks = create(rngs)
    self.ln = nnx.LayerNorm(D, rngs=rngs)

  def __call__(self, tokens):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(x, block):
      return block(x)

    return self.embed.attend(self.ln(forward(self.embed(tokens), self.blocks)))


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_small_linen_transformer_trains_with_every_recipe(recipe):
  q = snn.quantize(LinenLm(), recipe)
  _decreases(_train_linen(q, lambda v, x, rngs: q.apply(v, x, rngs=rngs)))


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_small_nnx_scan_transformer_trains_with_every_recipe(recipe):
  model = snn.quantize(NnxLm(nnx.Rngs(0)), recipe, rngs=1)
  _decreases(_train_nnx(model))
