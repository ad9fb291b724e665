"""s3r.nn.quantize_fn on plain JAX functions: which products it quantizes, with which keys, under which
transformations; each checked against explicit s3r.qmatmul calls on the same operands."""

from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
import s3r.nn as snn
from labtools.analysis import jaxpr as jaxpr_analysis

KEY = jax.random.key(3)
B, S, D, F, L = 2, 6, 16, 32, 3


def _params():
  k = jax.random.split(jax.random.key(0), 4)
  return {
    "embed": jax.random.normal(k[0], (11, D)) * 0.5,
    "w_in": jax.random.normal(k[1], (D, F)) * 0.2,
    "w_out": jax.random.normal(k[2], (F, D)) * 0.2,
    "stack": jax.random.normal(k[3], (L, D, D)) * 0.3,
  }


TOKENS = jax.random.randint(jax.random.key(1), (B, S), 0, 11)


def _mlp_attn_logits(p, tokens, mm):
  x = p["embed"][tokens]  # gather: an activation
  h = jax.nn.gelu(mm(x, p["w_in"], 0))
  x = x + mm(h, p["w_out"], 1)
  scores = jnp.einsum("bsd,btd->bst", x, x)  # activation x activation: left alone
  x = jax.nn.softmax(scores) @ x
  return mm(x, p["embed"].T, 2)  # tied output projection


def _plain(p, tokens):
  return _mlp_attn_logits(p, tokens, lambda x, w, i: jnp.matmul(x, w))


def _explicit(recipe, key):
  return lambda p, tokens: _mlp_attn_logits(
    p, tokens, lambda x, w, i: s3r.qmatmul(x, w, key=jax.random.fold_in(key, i), recipe=recipe)
  )


def _loss(f):
  return lambda p, tokens: jnp.mean(f(p, tokens) ** 2)


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "s3r", "int8_sr", "bf16"])
def test_projections_equal_explicit_qmatmul_calls_keyed_by_call_site(recipe):
  p = _params()
  quantized = snn.quantize_fn(_plain, recipe, key=KEY)
  np.testing.assert_array_equal(np.asarray(quantized(p, TOKENS)), np.asarray(_explicit(recipe, KEY)(p, TOKENS)))
  g = jax.jit(jax.grad(_loss(quantized)))(p, TOKENS)
  g_ref = jax.jit(jax.grad(_loss(_explicit(recipe, KEY))))(p, TOKENS)
  for name in p:
    np.testing.assert_array_equal(np.asarray(g[name]), np.asarray(g_ref[name]), err_msg=name)


def test_sites_lists_parameter_products_only_and_the_program_has_their_int8_gemms():
  p = _params()
  found = snn.sites(_plain, p, TOKENS)
  assert [(s.index, s.param, s.weight_shape) for s in found] == [
    (0, "w_in", (D, F)),
    (1, "w_out", (F, D)),
    (2, "embed", (D, 11)),  # the transposed embedding, as the product receives it
  ]
  program = jax.make_jaxpr(jax.grad(_loss(snn.quantize_fn(_plain, "s3r_ec_dx", key=KEY))))(p, TOKENS)
  assert len(jaxpr_analysis.int8_dots(program)) == 4 * len(found)  # forward, dX, dW, S3R-EC correction


def test_rule_skip_and_predicate_leave_those_products_unquantized():
  p = _params()
  rule = snn.Rule(skip=("embed",), predicate=lambda site: site.weight_shape != (F, D))
  assert [s.quantized for s in snn.sites(_plain, p, TOKENS, rule=rule)] == [True, False, False]
  program = jax.make_jaxpr(jax.grad(_loss(snn.quantize_fn(_plain, "s3r_ec_dx", key=KEY, rule=rule))))(p, TOKENS)
  assert len(jaxpr_analysis.int8_dots(program)) == 4


def test_a_skip_pattern_matching_no_projection_raises_listing_them():
  with pytest.raises(ValueError, match="'lm_head'.*w_in, w_out, embed"):
    snn.quantize_fn(_plain, key=KEY, rule=snn.Rule(skip=("lm_head",)))(_params(), TOKENS)
  with pytest.raises(TypeError, match="Rule.skip"):
    snn.Rule(skip=cast(Any, "embed"))  # a string where a tuple belongs, on purpose
  with pytest.raises(TypeError, match="Rule.predicate"):
    snn.Rule(predicate=cast(Any, 3))


def test_forward_needs_no_key_and_a_stochastic_gradient_without_one_raises():
  p = _params()
  y = snn.quantize_fn(_plain, "s3r_ec_dx")(p, TOKENS)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(_explicit("s3r_ec_dx", KEY)(p, TOKENS)))
  with pytest.raises(ValueError, match="needs a key"):
    jax.grad(_loss(snn.quantize_fn(_plain, "s3r_ec_dx")))(p, TOKENS)


def _scanned(p, x, mm, remat=False):
  def body(h, w):
    step = lambda h, w: jnp.tanh(mm(h, w))
    return (jax.checkpoint(step) if remat else step)(h, w), None

  return jax.lax.scan(body, x, p["stack"])[0]


@pytest.mark.parametrize("remat", [False, True], ids=["scan", "scan_of_checkpoint"])
def test_scan_over_stacked_layers_folds_the_iteration_into_the_site_key(remat):
  p = _params()
  x = jax.random.normal(jax.random.key(5), (B, S, D))
  plain = lambda p, x: _scanned(p, x, jnp.matmul, remat)
  site_key = jax.random.fold_in(KEY, 0)  # one site, in the body

  def explicit(p, x):
    for layer in range(L):
      x = jnp.tanh(s3r.qmatmul(x, p["stack"][layer], key=jax.random.fold_in(site_key, layer)))
    return x

  assert [(s.param, s.weight_shape) for s in snn.sites(plain, p, x)] == [("stack", (D, D))]
  loss = lambda f: lambda p, x: jnp.sum(f(p, x) ** 2)
  g = jax.jit(jax.grad(loss(snn.quantize_fn(plain, key=KEY)), argnums=(0, 1)))(p, x)
  g_ref = jax.jit(jax.grad(loss(explicit), argnums=(0, 1)))(p, x)
  np.testing.assert_allclose(np.asarray(g[0]["stack"]), np.asarray(g_ref[0]["stack"]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(g[1]), np.asarray(g_ref[1]), rtol=1e-5, atol=1e-6)
  program = jax.make_jaxpr(jax.grad(loss(snn.quantize_fn(plain, key=KEY))))(p, x)
  names = {e.primitive.name for e in jaxpr_analysis.iter_eqns(program)}
  assert "scan" in names and (("remat2" in names or "checkpoint" in names) if remat else True)


def test_jit_and_cond_bodies_are_interpreted_with_one_site_per_branch():
  p = _params()
  x = jax.random.normal(jax.random.key(5), (B, S, D))

  def plain(p, x, flag):
    h = jax.jit(lambda x: x @ p["w_in"])(x)
    return jax.lax.cond(flag, lambda h: h @ p["w_out"], lambda h: -(h @ p["w_out"]), h)

  def explicit(p, x, flag):
    h = s3r.qmatmul(x, p["w_in"], key=jax.random.fold_in(KEY, 0))
    if flag:
      return s3r.qmatmul(h, p["w_out"], key=jax.random.fold_in(KEY, 2))  # cond lists the false branch first
    return -s3r.qmatmul(h, p["w_out"], key=jax.random.fold_in(KEY, 1))

  assert [s.index for s in snn.sites(plain, p, x, True)] == [0, 1, 2]
  for flag in (True, False):
    loss = lambda f: lambda p: jnp.sum(f(p, x, flag) ** 2)
    g = jax.grad(loss(snn.quantize_fn(plain, key=KEY)))(p)
    g_ref = jax.grad(loss(explicit))(p)
    for name in ("w_in", "w_out"):
      np.testing.assert_allclose(np.asarray(g[name]), np.asarray(g_ref[name]), rtol=1e-5, atol=1e-6)


def test_a_vmap_inside_the_function_is_one_batched_product():
  p = _params()
  x = jax.random.normal(jax.random.key(5), (B, S, D))
  per_token = lambda p, t: p["w_in"].T @ t  # weight as the lhs, one token [D]
  plain = lambda p, x: jax.vmap(jax.vmap(lambda t: per_token(p, t)))(x)
  (site,) = snn.sites(plain, p, x)
  assert site.activation_shape == (B, S, D)
  g = jax.grad(lambda p: jnp.sum(snn.quantize_fn(plain, key=KEY)(p, x) ** 2))(p)
  g_ref = jax.grad(lambda p: jnp.sum(s3r.qmatmul(x, p["w_in"], key=jax.random.fold_in(KEY, 0)) ** 2))(p)
  np.testing.assert_array_equal(np.asarray(g["w_in"]), np.asarray(g_ref["w_in"]))
