"""quantize(skip=...): a pattern that matches no projection layer is an error listing the layers there are."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import s3r.nn as snn

X = jnp.ones((2, 4, 8))


class _Mlp(nnx.Module):
  def __init__(self, rngs):
    self.up = nnx.Linear(8, 16, rngs=rngs)
    self.lm_head = nnx.Linear(16, 8, rngs=rngs)


class _MoeLike(_Mlp):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.router = nnx.Linear(8, 4, rngs=rngs)


class _Deep(nnx.Module):
  def __init__(self, rngs, n=40):
    self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(n)])


def test_nnx_skip_typo_raises_naming_the_pattern_and_the_layers_and_quantizes_nothing():
  model = _Mlp(nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"skip pattern\(s\) 'lm_haed' match no .* layers are: lm_head, up$"):
    snn.quantize(model, "s3r", skip=("lm_haed",))
  assert model.up.dot_general is jax.lax.dot_general and model.lm_head.dot_general is jax.lax.dot_general


def test_nnx_skip_pattern_of_another_model_is_an_error_for_a_model_without_that_layer():
  snn.quantize(_MoeLike(nnx.Rngs(0)), "s3r", skip=("lm_head", "router"))
  with pytest.raises(ValueError, match=r"skip pattern\(s\) 'router' match no") as e:
    snn.quantize(_Mlp(nnx.Rngs(0)), "s3r", skip=("lm_head", "router"))
  assert "'lm_head'" not in str(e.value)


def test_nnx_skip_of_a_parent_module_name_matches_no_layer_and_says_what_patterns_match():
  with pytest.raises(ValueError, match=r"'layers' match no .*name or its whole path"):
    snn.quantize(_Deep(nnx.Rngs(0), n=2), "s3r", skip=("layers",))
  snn.quantize(_Deep(nnx.Rngs(0), n=2), "s3r", skip=("layers/*",))


def test_nnx_skip_error_lists_a_long_model_truncated():
  with pytest.raises(ValueError, match=r"its 40 layers are: layers/0, layers/1, .*layers/15, and 24 more$"):
    snn.quantize(_Deep(nnx.Rngs(0)), "s3r", skip=("lm_head",))


class _LinenMlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(8, name="lm_head")(nn.relu(nn.Dense(16, name="up")(x)))


def test_linen_skip_typo_raises_at_init_listing_the_layers():
  q = snn.quantize(_LinenMlp(), "s3r", skip=("lm_haed",))
  with pytest.raises(ValueError, match=r"'lm_haed' match no Dense/DenseGeneral layer .* layers are: up, lm_head$"):
    q.init(jax.random.key(0), X)


def test_linen_skip_typo_raises_when_a_jitted_apply_is_first_traced():
  variables = _LinenMlp().init(jax.random.key(0), X)
  q = snn.quantize(_LinenMlp(), "s3r", skip=("head",))
  with pytest.raises(ValueError, match=r"'head' match no"):
    jax.jit(lambda v: q.apply(v, X))(variables)


def test_linen_skip_typo_raises_on_leaving_intercept_and_a_matching_skip_does_not():
  module = _LinenMlp()
  variables = module.init(jax.random.key(0), X)
  q = snn.quantize(module, "s3r", skip=("lm_head", "router"))
  with pytest.raises(ValueError, match=r"'router' match no"), q.intercept():
    module.apply(variables, X)
  ok = snn.quantize(module, "s3r", skip=("lm_head",))
  with ok.intercept():
    module.apply(variables, X)
