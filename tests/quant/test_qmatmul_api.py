"""qmatmul's contract as a JAX function: shapes, dtypes, transformations, bad input, edge cases."""

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from tests.quant.reference import grads

INT8 = [n for n, r in s3r.RECIPES.items() if r.quantized]


def _xw(shape_x=(2, 8, 16), n=12, dtype=jnp.bfloat16):
  x = jax.random.normal(jax.random.key(0), shape_x, dtype)
  w = jax.random.normal(jax.random.key(1), (shape_x[-1], n)) * 0.1
  return x, w


@pytest.mark.parametrize("recipe", list(s3r.RECIPES))
def test_every_recipe_returns_the_input_dtype_and_finite_gradients(recipe):
  x, w = _xw()
  y = s3r.qmatmul(x, w, key=jax.random.key(2), recipe=recipe)
  assert y.shape == (2, 8, 12) and y.dtype == jnp.bfloat16
  dx, dw = jax.jit(functools.partial(grads, recipe))(x, w, jnp.ones((2, 8, 12)), jax.random.key(3))
  assert dx.dtype == x.dtype and dw.dtype == w.dtype
  assert np.isfinite(np.asarray(dx, np.float32)).all() and np.isfinite(np.asarray(dw)).all()


def test_two_dimensional_x_is_one_example_of_t_tokens():
  x, w = _xw((1, 8, 16))
  key = jax.random.key(4)
  f3 = lambda a, b: jnp.sum(s3r.qmatmul(a, b, key=key, recipe="s3r_ec").astype(jnp.float32) ** 2)
  f2 = lambda a, b: jnp.sum(s3r.qmatmul(a[0], b, key=key, recipe="s3r_ec").astype(jnp.float32) ** 2)
  g3 = jax.grad(f3, argnums=(0, 1))(x, w)
  g2 = jax.grad(f2, argnums=(0, 1))(x, w)
  for a, b in zip(g3, g2):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_same_key_gives_same_gradient_and_new_key_a_different_one():
  x, w = _xw()
  g = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 12)), jnp.bfloat16)
  a = grads("s3r", x, w, g, jax.random.key(5))[1]
  b = grads("s3r", x, w, g, jax.random.key(5))[1]
  c = grads("s3r", x, w, g, jax.random.key(6))[1]
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_raw_uint32_keys_are_accepted():
  x, w = _xw()
  raw = jax.random.PRNGKey(0)
  typed = jax.random.wrap_key_data(raw)
  g = jnp.ones((2, 8, 12))
  np.testing.assert_array_equal(
    np.asarray(grads("int8_sr", x, w, g, raw)[1]), np.asarray(grads("int8_sr", x, w, g, typed)[1])
  )


def test_works_under_jit_grad_checkpoint_and_scan_over_layers():
  x, _ = _xw((2, 8, 16))
  ws = jax.random.normal(jax.random.key(1), (3, 16, 16)) * 0.2

  def net(ws, x, key):
    def layer(h, inputs):
      w, k = inputs
      return jax.checkpoint(lambda h: jnp.tanh(s3r.qmatmul(h, w, key=k, recipe="s3r_ec_dx")))(h), None

    h, _ = jax.lax.scan(layer, x, (ws, jax.random.split(key, 3)))
    return jnp.mean(h.astype(jnp.float32) ** 2)

  dws = jax.jit(jax.grad(net))(ws, x, jax.random.key(0))
  assert dws.shape == ws.shape and np.isfinite(np.asarray(dws)).all() and np.abs(np.asarray(dws)).sum() > 0


def test_all_zero_upstream_gradient_gives_zero_gradients_not_nan():
  x, w = _xw()
  for recipe in INT8:
    dx, dw = grads(recipe, x, w, jnp.zeros((2, 8, 12)), jax.random.key(0))
    assert not np.asarray(dx, np.float32).any() and not np.asarray(dw).any(), recipe


def test_all_zero_input_gives_zero_output_and_finite_gradients():
  _, w = _xw()
  x = jnp.zeros((2, 8, 16), jnp.bfloat16)
  y = s3r.qmatmul(x, w, key=jax.random.key(0), recipe="s3r_ec")
  assert not np.asarray(y, np.float32).any()
  dx, dw = grads("s3r_ec", x, w, jnp.ones((2, 8, 12)), jax.random.key(1))
  assert np.isfinite(np.asarray(dx, np.float32)).all() and not np.asarray(dw).any()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_upstream_gradient_propagates_as_non_finite(bad):
  x, w = _xw()
  g = jnp.ones((2, 8, 12)).at[1, 3, 4].set(bad)
  for recipe in INT8:
    dx, dw = grads(recipe, x, w, g, jax.random.key(0))
    assert not np.isfinite(np.asarray(dx, np.float32)).all(), recipe
    assert not np.isfinite(np.asarray(dw)).all(), recipe


@pytest.mark.parametrize(
  "x_shape, w_shape, match",
  [
    ((2, 8, 16), (15, 12), r"last dim of x \(16\) must equal the first dim of w \(15\)"),
    ((), (16, 12), r"x must be \[..., K\] \(at least one dim\), got shape \(\)"),
    ((1, 2, 8, 16), (12, 12), r"last dim of x \(16\) must equal the first dim of w \(12\)"),
    ((2, 8, 16), (16, 12, 1), r"w must be \[K, N\], got shape \(16, 12, 1\)"),
  ],
)
def test_bad_shapes_raise_value_error_naming_argument_and_shapes(x_shape, w_shape, match):
  with pytest.raises(ValueError, match=match):
    jax.jit(lambda x, w: s3r.qmatmul(x, w, key=jax.random.key(0), recipe="s3r"))(jnp.zeros(x_shape), jnp.zeros(w_shape))


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int32, jnp.complex64, jnp.bool_])
def test_non_float_inputs_raise_type_error_naming_the_dtype(dtype):
  with pytest.raises(TypeError, match=f"x must have a real floating dtype.*{jnp.dtype(dtype).name}"):
    s3r.qmatmul(jnp.zeros((2, 4), dtype), jnp.zeros((4, 3)), key=jax.random.key(0), recipe="s3r")
  with pytest.raises(TypeError, match="w must have a real floating dtype"):
    s3r.qmatmul(jnp.zeros((2, 4)), jnp.zeros((4, 3), dtype), key=jax.random.key(0), recipe="s3r")


def test_bad_recipe_raises():
  x, w = _xw()
  with pytest.raises(ValueError, match="unknown recipe 'int4'; valid names: bf16, int8_rtne"):
    s3r.qmatmul(x, w, key=jax.random.key(0), recipe="int4")
  with pytest.raises(TypeError, match="recipe must be a s3r.Recipe or a recipe name"):
    s3r.qmatmul(x, w, key=jax.random.key(0), recipe=cast(Any, 8))  # not a recipe, on purpose


@pytest.mark.parametrize("recipe", [n for n, r in s3r.RECIPES.items() if r.stochastic])
def test_stochastic_recipes_run_forward_without_key_and_raise_when_differentiated(recipe):
  x, w = _xw()
  y = jax.jit(lambda x, w: s3r.qmatmul(x, w, recipe=recipe))(x, w)
  np.testing.assert_array_equal(
    np.asarray(y, np.float32), np.asarray(s3r.qmatmul(x, w, key=jax.random.key(0), recipe=recipe), np.float32)
  )
  with pytest.raises(ValueError, match=f"recipe '{recipe}' rounds the gradient stochastically.*key=jax.random.key"):
    jax.grad(lambda w: jnp.sum(s3r.qmatmul(x, w, recipe=recipe).astype(jnp.float32)))(w)
  with pytest.raises(ValueError, match="needs key="):
    s3r.gradient_codes(x, w, jnp.ones((2, 8, 12)), recipe=recipe)


def test_deterministic_recipes_need_no_key_and_bad_keys_are_rejected():
  x, w = _xw()
  s3r.qmatmul(x, w, recipe="int8_rtne")
  s3r.qmatmul(x, w, recipe="bf16")
  with pytest.raises(ValueError, match=r"single key \(shape \(\)\), got shape \(2,\)"):
    s3r.qmatmul(x, w, key=jax.random.split(jax.random.key(0)), recipe="s3r")
  with pytest.raises(TypeError, match="key must be a jax.random.key"):
    s3r.qmatmul(x, w, key=jnp.zeros((3,), jnp.float32), recipe="s3r")
