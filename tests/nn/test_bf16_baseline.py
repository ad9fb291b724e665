"""The `bf16` recipe through every adapter trains like the unmodified model, to bf16 rounding.

The bf16 recipe rounds both operands of every projection to bf16 (f32 accumulation) and, in the
backward, the upstream gradient (dX then comes out in the activation dtype, dW in f32). How far that
may move a training run is measured with a model of those roundings (Monte Carlo arithmetic): the same
adapter with `qmatmul` replaced by an f32 product whose operands, and whose dX and dW, are multiplied by
(1 + u e), e uniform on [-1, 1] and drawn anew per element, call and step, u = 2^-8 the largest relative
error of a bf16 rounding. D such runs give, per step, the RMS deviation sigma of the loss from the
unmodified model's run (same init, batch, Adam). The bf16 run must stay within K sigma of it at every
step: if its deviation is a draw of the rounding model's, |dev| / sigma is a t variable with D degrees
of freedom, beyond K = 10 with probability below 1e-5 per check. The rounding model's relative errors
have variance u^2/3, the most a round-to-nearest bf16 error can have (u^2/12 to u^2/3 across a
binade), so sigma errs large.
Negative control: the unmodified model trained at 1.1x the learning rate leaves that band.
Per adapter: Linen `s3r.nn.quantize`, NNX `s3r.nn.quantize` (the miniGPT fixture), `quantize_fn`
on a plain JAX function and on the Equinox fixture. Each compiles three training programs (8-20 s on
two cores): the plain function's runs in the default suite, the other three with `-m slow`; all four
route through the same `_quantized_dot` (test_intercept.py checks its bf16 products against `qmatmul`
bit for bit).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import s3r.nn as snn

U = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits)
D = 8  # draws of the rounding model
K = 10.0  # P(|t_8| > 10) < 1e-5
STEPS, LR = 3, 1e-2
_DOT: Any = sys.modules["s3r.nn.dot_general"]  # the module every adapter's projection goes through


@jax.custom_vjp
def _noisy_cotangent(a, noise):
  return a


_noisy_cotangent.defvjp(lambda a, n: (a, n), lambda n, g: (g * (1 + U * n).astype(g.dtype), jnp.zeros_like(n)))


class _RoundingModel:
  """`qmatmul` as an f32 product with bf16-sized relative errors on its operands and their gradients."""

  def __init__(self):
    self.key: jax.Array | None = None
    self.calls = 0

  def matmul(self, x, w, **unused):
    assert self.key is not None, "matmul runs inside applied(key)"
    keys = jax.random.split(jax.random.fold_in(self.key, self.calls), 4)
    self.calls += 1
    e = lambda k, a: jax.random.uniform(k, a.shape, jnp.float32, -1.0, 1.0)  # noqa: E731
    xt = _noisy_cotangent(x * (1 + U * e(keys[0], x)), e(keys[2], x))
    wt = _noisy_cotangent(w * (1 + U * e(keys[1], w)), e(keys[3], w))
    return jnp.matmul(xt, wt, precision=jax.lax.Precision.HIGHEST).astype(x.dtype)

  @contextlib.contextmanager
  def applied(self, key):
    saved, _DOT.qmatmul = _DOT.qmatmul, self.matmul
    self.key, self.calls = key, 0
    try:
      yield
    finally:
      _DOT.qmatmul, self.key = saved, None


_ROUNDING = _RoundingModel()


def _losses(loss, params, key=None, lr=LR):
  """Adam on `loss(params)` for STEPS steps; with `key`, under the rounding model (fresh draws per step)."""
  opt = optax.adam(lr)

  def step(carry, i):
    p, state = carry
    if key is None:
      value, g = jax.value_and_grad(loss)(p)
    else:
      with _ROUNDING.applied(jax.random.fold_in(key, i)):
        value, g = jax.value_and_grad(loss)(p)
    updates, state = opt.update(g, state, p)
    return (optax.apply_updates(p, updates), state), value

  return jax.lax.scan(step, (params, opt.init(params)), jnp.arange(STEPS))[1]


def _check(plain, bf16, params, bf16_params=None):
  bf16_params = params if bf16_params is None else bf16_params
  train_plain = jax.jit(lambda p, lr: _losses(plain, p, lr=lr))
  ref = np.asarray(train_plain(params, LR))
  got = np.asarray(jax.jit(lambda p: _losses(bf16, p))(bf16_params))
  draws = jax.random.split(jax.random.key(5), D)
  model = np.asarray(jax.jit(jax.vmap(lambda k: _losses(bf16, bf16_params, key=k)))(draws), np.float64)
  sigma = np.sqrt(np.mean((model - ref) ** 2, axis=0))
  assert np.all(sigma > 0) and np.all(sigma < 1e-2 * np.abs(ref)), sigma  # rounding-sized, and measurable
  assert np.all(np.abs(got - ref) <= K * sigma), (got - ref, sigma)
  faster = np.asarray(train_plain(params, 1.1 * LR))
  assert np.any(np.abs(faster - ref) > K * sigma), (faster - ref, sigma)  # the band tells training apart
  assert ref[-1] < ref[0] - 0.1  # the steps train


V, DIM, H, B, S = 32, 16, 2, 2, 8
TOKENS = jax.random.randint(jax.random.key(0), (B, S + 1), 0, V)


def _xent(logits):
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), TOKENS[:, 1:]).mean()


class _LinenLM(linen.Module):
  @linen.compact
  def __call__(self, tokens):
    x = linen.Embed(V, DIM)(tokens)
    h = linen.LayerNorm()(x)
    x = x + jnp.asarray(linen.MultiHeadDotProductAttention(num_heads=H)(h, mask=linen.make_causal_mask(tokens)))
    x = x + linen.Dense(DIM)(jax.nn.gelu(linen.Dense(2 * DIM)(linen.LayerNorm()(x))))
    return linen.Dense(V)(linen.LayerNorm()(x))


@pytest.mark.slow
def test_linen_quantize_bf16_trains_like_the_unmodified_module():
  module = _LinenLM()
  params = module.init(jax.random.key(1), TOKENS[:, :-1])["params"]
  quantized = snn.quantize(module, "bf16")
  _check(
    lambda p: _xent(module.apply({"params": p}, TOKENS[:, :-1])),
    lambda p: _xent(quantized.apply({"params": p}, TOKENS[:, :-1])),
    params,
  )


@pytest.mark.slow
def test_nnx_quantize_bf16_trains_like_the_unmodified_minigpt():
  from tests.nn import minigpt

  inputs, targets = minigpt.batch(4)
  with nnx.use_eager_sharding(False):
    graph, params = nnx.split(minigpt.MiniGPT(rngs=nnx.Rngs(0)), nnx.Param)
    q_graph, q_params = nnx.split(snn.quantize(minigpt.MiniGPT(rngs=nnx.Rngs(0)), "bf16"), nnx.Param)
  _check(
    lambda p: minigpt.loss_fn(nnx.merge(graph, p), inputs, targets),
    lambda p: minigpt.loss_fn(nnx.merge(q_graph, p), inputs, targets),
    params,
    q_params,
  )


def _plain_lm(p, tokens):
  x = p["embed"][tokens]
  x = x + jax.nn.gelu(x @ p["w_in"]) @ p["w_out"]
  scores = jnp.einsum("bsd,btd->bst", x, x) / np.sqrt(DIM)  # activations only: not a projection
  x = x + jax.nn.softmax(jnp.where(jnp.tri(S, dtype=bool), scores, -1e9)) @ x
  return x @ p["embed"].T


def test_quantize_fn_bf16_trains_like_the_unmodified_function():
  k = jax.random.split(jax.random.key(2), 3)
  params = {
    "embed": jax.random.normal(k[0], (V, DIM)) * 0.5,
    "w_in": jax.random.normal(k[1], (DIM, 2 * DIM)) * 0.2,
    "w_out": jax.random.normal(k[2], (2 * DIM, DIM)) * 0.2,
  }
  quantized = snn.quantize_fn(_plain_lm, "bf16")
  _check(lambda p: _xent(_plain_lm(p, TOKENS[:, :-1])), lambda p: _xent(quantized(p, TOKENS[:, :-1])), params)


@pytest.mark.slow
def test_quantize_fn_bf16_trains_like_the_unmodified_equinox_model():
  eqx = pytest.importorskip("equinox")
  from benchmarks import eqx_transformer

  params, static = eqx.partition(
    eqx_transformer.Transformer(V, DIM, H, 2 * DIM, 1, key=jax.random.key(3)), eqx.is_array
  )
  quantized = snn.quantize_fn(eqx_transformer.loss, "bf16")
  _check(
    lambda p: eqx_transformer.loss(eqx.combine(p, static), TOKENS),
    lambda p: quantized(eqx.combine(p, static), TOKENS),
    params,
  )
