"""The `bf16` recipe's GEMMs: forward, dX and dW each take bf16 operands and accumulate in f32 (as a bf16
dense layer of Flax or MaxText does), with Y and dX in x's dtype and dW in w's. Autodiff of a bf16
product with an f32 result would transpose it with the f32 cotangent: f32 operands in the backward GEMMs.

Checked on the jaxprs of the SwiGLU FFN block's forward and backward and of a tiny model's gradient
(tests/bench/test_aot.py checks the H100 target's compiled GEMMs with the `gpu-aot` extra)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis.jaxpr import shaped
from s3r import model as M
from s3r.train import step as train_step

T, H, F = 48, 32, 80  # tokens, model width, FFN width: distinct
BF16_GEMM = ("bfloat16", "bfloat16", "float32")  # (lhs, rhs, result) dtypes


def _dots(jaxpr) -> collections.Counter:
  """(lhs dtype, rhs dtype, result dtype, lhs shape, rhs shape) of every dot_general, nested ones included."""
  return collections.Counter(
    (*(str(shaped(v).dtype) for v in (*e.invars, e.outvars[0])), *(tuple(shaped(v).shape) for v in e.invars))
    for e in jaxpr_analysis.iter_eqns(jaxpr)
    if e.primitive.name == "dot_general"
  )


def _ffn(x, wg, wu, wd):
  mm = lambda a, w: s3r.qmatmul(a, w, recipe="bf16")
  return mm(jax.nn.silu(mm(x, wg)) * mm(x, wu), wd)


def test_every_gemm_of_the_bf16_ffn_block_forward_and_backward_takes_bf16_operands():
  args = (
    jnp.zeros((T, H), jnp.bfloat16),
    jnp.zeros((H, F)),
    jnp.zeros((H, F)),
    jnp.zeros((F, H)),
    jnp.zeros((T, H), jnp.bfloat16),
  )
  jaxpr = jax.make_jaxpr(lambda x, wg, wu, wd, dy: jax.vjp(_ffn, x, wg, wu, wd)[1](dy))(*args)
  dots = _dots(jaxpr)
  assert sum(dots.values()) == 9, dots  # forward, dX and dW of three projections
  assert all(d[:3] == BF16_GEMM for d in dots), dots


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_bf16_gradients_are_f32_accumulated_products_of_bf16_operands_in_the_operands_dtypes(x_dtype):
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (2, 3, H)).astype(x_dtype)
  w = jax.random.normal(kw, (H, F))
  g = jax.random.normal(kg, (2, 3, F)).astype(x_dtype)
  y, vjp = jax.vjp(lambda x, w: s3r.qmatmul(x, w, recipe="bf16"), x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == x_dtype and dw.dtype == jnp.float32
  xb, wb, gb = (a.astype(jnp.bfloat16) for a in (x.reshape(-1, H), w, g.reshape(-1, F)))
  f32 = jnp.float32
  want_dx = jnp.matmul(gb, wb.T, preferred_element_type=f32).astype(x_dtype).reshape(x.shape)
  want_dw = jnp.matmul(xb.T, gb, preferred_element_type=f32)  # not rounded to bf16 on the way to w's f32
  np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(want_dx, np.float32))
  np.testing.assert_array_equal(np.asarray(dw), np.asarray(want_dw))


def _grad_dots(recipe: str) -> collections.Counter:
  """The dot_generals of the gradient of a one-layer model's loss (the train step's GEMMs)."""
  cfg = M.preset("llama-tiny", recipe=recipe, layers=1)
  graphdef = M.graphdef(cfg)

  def loss(params, tokens_BxS1, key):
    logits = M.apply(graphdef, params, tokens_BxS1[:, :-1], key=key)
    return train_step.cross_entropy(logits, tokens_BxS1[:, 1:])

  params = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((2, 25), jnp.int32)
  return _dots(jax.make_jaxpr(jax.grad(loss))(params, tokens, jax.random.key(0)))


def test_the_bf16_train_step_runs_its_projections_on_bf16_gemms_and_shares_the_other_dots_with_int8():
  # The logits projection and the attention products are not recipe projections: every recipe runs them alike
  # (here those of int8_rtne, whose projections are int8 dots). What the bf16 step adds, forward, dX and dW of
  # each projection, are bf16 x bf16 -> f32 GEMMs.
  bf16 = _grad_dots("bf16")
  shared = collections.Counter({d: n for d, n in _grad_dots("int8_rtne").items() if d[0] != "int8"})
  assert not shared - bf16, shared - bf16
  projections = bf16 - shared
  assert sum(projections.values()) == 3 * len(M.PROJECTIONS), projections
  assert all(d[:3] == BF16_GEMM for d in projections), projections
