"""qmatmul on any number of leading dims, vectors and empty inputs, and its higher-order derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r

K, N = 16, 12


def _w():
  return jax.random.normal(jax.random.key(1), (K, N)) * 0.1


def _grads(recipe, x, w, g, key):
  _, vjp = jax.vjp(lambda x, w: s3r.qmatmul(x, w, key=key, recipe=recipe), x, w)
  return vjp(g.astype(x.dtype))


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "s3r_ec_bcast", "int8_sr", "bf16"])
def test_rank_four_input_is_b_examples_of_the_flattened_middle_axes(recipe):
  """[B, H, S, K] equals [B, H*S, K]: the first axis is the example axis, the rest are tokens."""
  x4 = jax.random.normal(jax.random.key(0), (2, 3, 4, K), jnp.bfloat16)
  g4 = jax.random.normal(jax.random.key(2), (2, 3, 4, N))
  key = jax.random.key(3)
  w = _w()
  y4 = s3r.qmatmul(x4, w, key=key, recipe=recipe)
  y3 = s3r.qmatmul(x4.reshape(2, 12, K), w, key=key, recipe=recipe)
  assert y4.shape == (2, 3, 4, N)
  np.testing.assert_array_equal(np.asarray(y4, np.float32), np.asarray(y3, np.float32).reshape(2, 3, 4, N))
  dx4, dw4 = _grads(recipe, x4, w, g4, key)
  dx3, dw3 = _grads(recipe, x4.reshape(2, 12, K), w, g4.reshape(2, 12, N), key)
  np.testing.assert_array_equal(np.asarray(dx4, np.float32), np.asarray(dx3, np.float32).reshape(2, 3, 4, K))
  np.testing.assert_array_equal(np.asarray(dw4), np.asarray(dw3))


def test_gradient_codes_of_a_rank_four_input_have_its_shape():
  x4 = jax.random.normal(jax.random.key(0), (2, 3, 4, K))
  g4 = jax.random.normal(jax.random.key(2), (2, 3, 4, N))
  q_dx, q_dw, _ = s3r.gradient_codes(x4, _w(), g4, key=jax.random.key(3), recipe="s3r_ec_dx")
  q3, _, _ = s3r.gradient_codes(
    x4.reshape(2, 12, K), _w(), g4.reshape(2, 12, N), key=jax.random.key(3), recipe="s3r_ec_dx"
  )
  assert q_dx.shape == q_dw.shape == (2, 3, 4, N)
  np.testing.assert_array_equal(np.asarray(q_dx).reshape(2, 12, N), np.asarray(q3))


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "int8_rtne", "bf16"])
def test_vector_input_is_one_token(recipe):
  x = jax.random.normal(jax.random.key(0), (K,))
  w, key, g = _w(), jax.random.key(3), jax.random.normal(jax.random.key(2), (N,))
  y = s3r.qmatmul(x, w, key=key, recipe=recipe)
  assert y.shape == (N,)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(s3r.qmatmul(x[None], w, key=key, recipe=recipe)[0]))
  dx, dw = _grads(recipe, x, w, g, key)
  dx1, dw1 = _grads(recipe, x[None], w, g[None], key)
  assert dx.shape == (K,)
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(dx1[0]))
  np.testing.assert_array_equal(np.asarray(dw), np.asarray(dw1))


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "int8_rtne", "int8_exact_bwd", "bf16"])
@pytest.mark.parametrize(
  "x_shape, w_shape", [((0, K), (K, N)), ((2, 0, K), (K, N)), ((2, 4, 0), (0, N)), ((2, 4, K), (K, 0))]
)
def test_empty_input_gives_empty_output_and_zero_gradients(recipe, x_shape, w_shape):
  x = jnp.ones(x_shape, jnp.bfloat16)
  w = jnp.ones(w_shape)
  y = jax.jit(lambda x, w: s3r.qmatmul(x, w, key=jax.random.key(0), recipe=recipe))(x, w)
  assert y.shape == x_shape[:-1] + w_shape[1:] and y.dtype == x.dtype
  assert not np.asarray(y, np.float32).any()
  dx, dw = jax.grad(
    lambda x, w: jnp.sum(s3r.qmatmul(x, w, key=jax.random.key(0), recipe=recipe).astype(jnp.float32)), argnums=(0, 1)
  )(x, w)
  assert dx.shape == x.shape and dw.shape == w.shape
  assert not np.asarray(dx, np.float32).any() and not np.asarray(dw).any()


def _loss(recipe):
  x = jax.random.normal(jax.random.key(0), (2, 4, K))
  return lambda w: jnp.sum(s3r.qmatmul(x, w, key=jax.random.key(5), recipe=recipe) ** 2)


@pytest.mark.parametrize("recipe", ["int8_rtne", "s3r_ec_dx", "int8_exact_bwd"])
@pytest.mark.parametrize("transform", ["grad_of_grad", "hessian", "jvp_of_grad"])
def test_second_derivatives_through_int8_recipes_raise(recipe, transform):
  f, w = _loss(recipe), _w()
  second = {
    "grad_of_grad": lambda: jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2))(w),
    "hessian": lambda: jax.hessian(f)(w),
    "jvp_of_grad": lambda: jax.jvp(jax.grad(f), (w,), (jnp.ones_like(w),)),
  }[transform]
  jax.grad(f)(w)  # first order is fine
  with pytest.raises(NotImplementedError, match=f"higher-order derivatives through recipe '{recipe}' are not defined"):
    second()


def test_second_derivatives_through_bf16_run_on_its_bf16_gemms():
  """bf16's backward is made of differentiable bf16 GEMMs: the Hessian-vector product of sum(y^2) is
  Xᵀ bf16(2 X V) on the bf16 operands X and V, f32 accumulation, and within bf16 rounding of the exact one."""
  x = jax.random.normal(jax.random.key(0), (2, 4, K))
  w, v = _w(), jax.random.normal(jax.random.key(7), (K, N))
  hvp = lambda f: np.asarray(jax.jvp(jax.grad(f), (w,), (v,))[1])
  got = hvp(_loss("bf16"))
  xb, vb = x.reshape(-1, K).astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  twice_y = (2 * jnp.matmul(xb, vb, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(got, np.asarray(jnp.matmul(xb.T, twice_y, preferred_element_type=jnp.float32)))
  exact = hvp(lambda w: jnp.sum(jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST) ** 2))
  assert 0 < np.linalg.norm(got - exact) < 3 * 2.0**-8 * np.linalg.norm(exact)  # three bf16 roundings: x, v, 2y
