"""An Equinox transformer, unchanged, trains through s3r.nn.quantize_fn: its projections are the
explicit qmatmul layers' bit for bit, its program has their int8 GEMMs, its gradient is unbiased."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

eqx = pytest.importorskip("equinox")

import s3r.nn as snn  # noqa: E402
from benchmarks import eqx_layers, eqx_transformer  # noqa: E402
from labtools.analysis import jaxpr as jaxpr_analysis  # noqa: E402

VOCAB, DIM, HEADS, HIDDEN, LAYERS, B, S = 32, 16, 2, 32, 2, 2, 8
TOKENS = jax.random.randint(jax.random.key(0), (B, S + 1), 0, VOCAB)
KEY = jax.random.key(9)
PROJECTIONS = LAYERS * 6 + 1  # per block q, k, v, o, mlp_in, mlp_out; the head


def _model():
  return eqx_transformer.Transformer(VOCAB, DIM, HEADS, HIDDEN, LAYERS, key=jax.random.key(1))


def _explicit(model, key, recipe):
  """The model with each Linear calling s3r.qmatmul, keyed as quantize_fn keys its call site."""
  order = {s.param: s.index for s in snn.sites(eqx_transformer.loss, model, TOKENS)}
  index = lambda path: order["/".join(snn.intercept._key_name(k) for k in path) + "/weight"]
  return eqx_layers.with_qmatmul(model, key, recipe, index)


def _grads(loss, model):
  return eqx.filter_jit(eqx.filter_grad(loss))(model, TOKENS)


def test_sites_are_the_linear_layers_and_the_attention_products_are_left_alone():
  found = snn.sites(eqx_transformer.loss, _model(), TOKENS)
  assert [s.param for s in found[:6]] == [
    f"blocks/0/{name}/weight" for name in ("attn/query_proj", "attn/key_proj", "attn/value_proj", "attn/output_proj")
  ] + ["blocks/0/mlp_in/weight", "blocks/0/mlp_out/weight"]
  assert len(found) == PROJECTIONS and found[-1].param == "head/weight"
  assert all(s.activation_shape[:2] == (B, S) for s in found)  # jax.vmap(model): B examples of S tokens


def _flat(g):
  return np.concatenate(
    [np.asarray(a).reshape(-1) for a in jax.tree_util.tree_leaves(eqx.filter(g, eqx.is_inexact_array))]
  )


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", pytest.param("s3r", marks=pytest.mark.slow)])
def test_gradients_equal_the_explicit_qmatmul_layers_to_float_rounding(recipe):
  model = _model()
  g = _flat(_grads(snn.quantize_fn(eqx_transformer.loss, recipe, key=KEY), model))
  g_ref = _flat(_grads(eqx_transformer.loss, _explicit(model, KEY, recipe)))
  # The int8 codes are the same (same operands, same keys); the unquantized ops around them (layer
  # norms, softmax, the embedding's scatter-add) are fused differently in the two programs: f32 rounding.
  tol = 1e-5 * np.abs(g_ref).max()
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=tol)
  other_keys = _flat(_grads(eqx_transformer.loss, _explicit(model, jax.random.key(10), recipe)))
  assert np.abs(other_keys - g_ref).max() > 100 * tol  # other thresholds: far outside that tolerance


def test_gradient_program_has_four_int8_gemms_per_projection():
  quantized = snn.quantize_fn(eqx_transformer.loss, "s3r_ec_dx", key=KEY)
  params, static = eqx.partition(_model(), eqx.is_array)
  program = jax.make_jaxpr(jax.grad(lambda p: quantized(eqx.combine(p, static), TOKENS)))(params)
  assert len(jaxpr_analysis.int8_dots(program)) == 4 * PROJECTIONS  # forward, dX, dW, S3R-EC correction
  skip_head = snn.quantize_fn(eqx_transformer.loss, "s3r_ec_dx", key=KEY, rule=snn.Rule(skip=("head",)))
  program = jax.make_jaxpr(jax.grad(lambda p: skip_head(eqx.combine(p, static), TOKENS)))(params)
  assert len(jaxpr_analysis.int8_dots(program)) == 4 * (PROJECTIONS - 1)


def test_trains_a_few_steps_with_s3r_ec_dx():
  model, opt = _model(), optax.adam(3e-3)
  state = opt.init(eqx.filter(model, eqx.is_inexact_array))

  @eqx.filter_jit
  def step(model, state, key):
    loss = snn.quantize_fn(eqx_transformer.loss, "s3r_ec_dx", key=key)
    value, g = eqx.filter_value_and_grad(loss)(model, TOKENS)
    updates, state = opt.update(g, state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), state, value

  losses = []
  for i in range(8):
    model, state, value = step(model, state, jax.random.fold_in(KEY, i))
    losses.append(float(value))
  assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.05, losses


def test_gradient_is_unbiased_for_the_exact_backward_of_the_int8_forward():
  model = _model()
  params, static = eqx.partition(model, eqx.is_inexact_array)

  def grad(recipe, key):
    loss = snn.quantize_fn(eqx_transformer.loss, recipe, key=key)
    g = jax.grad(lambda p: loss(eqx.combine(p, static), TOKENS))(params)
    return jnp.concatenate([a.reshape(-1) for a in jax.tree_util.tree_leaves(g)])

  draws = 64
  samples = np.asarray(jax.jit(jax.vmap(lambda k: grad("s3r_ec_dx", k)))(jax.random.split(KEY, draws)), np.float64)
  exact = np.asarray(jax.jit(lambda: grad("int8_exact_bwd", None))(), np.float64)
  mean, sem = samples.mean(0), samples.std(0, ddof=1) / np.sqrt(draws)
  noisy = sem > 1e-9 * (np.abs(exact) + 1e-9)
  assert noisy.mean() > 0.9  # the gradient is random almost everywhere, so the check has power
  z = (mean[noisy] - exact[noisy]) / sem[noisy]
  # |t| over ~6k elements from 63 degrees of freedom: beyond 6 has probability ~1e-7 each
  assert np.abs(z).max() < 6.0, np.abs(z).max()
  np.testing.assert_allclose(mean[~noisy], exact[~noisy], rtol=1e-4, atol=1e-7)
