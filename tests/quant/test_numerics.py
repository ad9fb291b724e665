"""Forward numerics: int8 codes, bit-exact RTNE forward, and the RTNE backward."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import s3r
from s3r.quant import numerics
from tests.quant.reference import Reference, grads, np_rtne_codes, np_scale


@settings(max_examples=40, deadline=None)
@given(
  hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=2, max_dims=2, max_side=12),
    elements=st.floats(-1e6, 1e6, width=32).filter(lambda v: v == 0 or abs(v) > 1e-30),
  )
)
def test_codes_lie_in_symmetric_int8_range_and_match_numpy(a):
  s = numerics.absmax_scale(jnp.asarray(a), axis=1)
  q = np.asarray(numerics.quantize_rtne(jnp.asarray(a), s[:, None]))
  assert q.dtype == np.int8 and q.min() >= -127 and q.max() <= 127
  np.testing.assert_array_equal(q, np_rtne_codes(a, np_scale(a, axis=1)[:, None]))


def test_zero_rows_get_scale_one_and_zero_codes():
  a = jnp.zeros((3, 4)).at[1].set(jnp.arange(4.0))
  s = np.asarray(numerics.absmax_scale(a, axis=1))
  assert s[0] == 1 and s[2] == 1 and s[1] == np.float32(3) / np.float32(127)


def test_rows_below_the_normal_float_range_quantize_to_zero():
  # max|x|/127 is subnormal there; XLA:CPU flushes it to 0, which takes the zero-row path.
  a = jnp.asarray([[1e-37, -5e-38], [1.0, 0.5]], jnp.float32)
  s = numerics.absmax_scale(a, axis=1)
  np.testing.assert_array_equal(np.asarray(numerics.quantize_rtne(a, s[:, None])), [[0, 0], [127, 64]])


def test_rtne_rounds_half_to_even():
  q = numerics.quantize_rtne(jnp.asarray([0.5, 1.5, 2.5, -0.5, -2.5]), jnp.float32(1))
  np.testing.assert_array_equal(np.asarray(q), [0, 2, 2, 0, -2])


def test_rtne_forward_matches_numpy_reference_bit_for_bit(rng):
  x = rng.standard_normal((2, 5, 16)).astype(np.float32)
  w = (rng.standard_normal((16, 12)) * 0.1).astype(np.float32)
  ref = Reference(x, w, np.zeros((2, 5, 12), np.float32))
  # the reference product in the same f32 arithmetic the contract prescribes
  acc = np.einsum("bsk,kn->bsn", ref.xq.astype(np.int64), ref.wq.astype(np.int64)).astype(np.float32)
  expected = acc * ref.sx[..., None] * ref.sw
  for name in ("int8_rtne", "s3r_ec_dx"):
    y = np.asarray(jax.jit(lambda a, b: s3r.qmatmul(a, b, key=jax.random.key(0), recipe=name))(x, w))
    np.testing.assert_array_equal(y, expected)


def test_int8_rtne_backward_matches_float_fake_quant_reference(rng):
  x = rng.standard_normal((2, 6, 16)).astype(np.float32)
  w = rng.standard_normal((16, 8)).astype(np.float32)
  g = rng.standard_normal((2, 6, 8)).astype(np.float32)
  ref = Reference(x, w, g)
  q = np.clip(np.round(ref.gp / ref.delta), -127, 127)
  dx_ref = (ref.delta / ref.sx[..., None]) * (q @ ref.wq.T.astype(np.float64))
  dw_ref = (ref.delta / ref.sw) * np.einsum("bsk,bsn->kn", ref.xq.astype(np.float64), q)
  dx, dw = grads("int8_rtne", jnp.asarray(x), jnp.asarray(w), g, None)
  np.testing.assert_allclose(np.asarray(dx), dx_ref, rtol=1e-5, atol=1e-6 * np.abs(dx_ref).max())
  np.testing.assert_allclose(np.asarray(dw), dw_ref, rtol=1e-5, atol=1e-6 * np.abs(dw_ref).max())


def test_exact_backward_reference_recipe_matches_float64_gradient_of_the_int8_forward(rng):
  x = rng.standard_normal((2, 6, 16)).astype(np.float32)
  w = rng.standard_normal((16, 8)).astype(np.float32)
  g = rng.standard_normal((2, 6, 8)).astype(np.float32)
  ref = Reference(x, w, g)
  dx, dw = grads("int8_exact_bwd", jnp.asarray(x), jnp.asarray(w), g, None)
  np.testing.assert_allclose(np.asarray(dx), ref.dx, rtol=1e-5, atol=1e-6 * np.abs(ref.dx).max())
  np.testing.assert_allclose(np.asarray(dw), ref.dw, rtol=1e-5, atol=1e-6 * np.abs(ref.dw).max())


@pytest.mark.parametrize("recipe", ["int8_rtne", "int8_sr", "s3r_ec_dx"])
def test_the_weight_layout_changes_no_gradient_bit(recipe, monkeypatch):
  """numerics.own_layout pins a weight's layout on GPU; a layout is not arithmetic. Forced here to the
  transposed (column-major) layout, which XLA:CPU honours, the program changes and no output bit does."""
  from jax.experimental.layout import Layout, with_layout_constraint

  def loss(x, w, key):
    return jnp.sum(s3r.qmatmul(x, w, key=key, recipe=recipe).astype(jnp.float32) ** 2)

  x = jax.random.normal(jax.random.key(0), (2, 64, 32), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (32, 48)) * 0.1
  key = jax.random.key(2)
  column_major = "f32[32,48]{0,1}"
  runs = []
  for pin in (False, True):
    if pin:
      monkeypatch.setattr(numerics, "own_layout", lambda a: with_layout_constraint(a, Layout(major_to_minor=(1, 0))))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w, key).compile()
    assert (column_major in (compiled.as_text() or "")) == pin
    runs.append(compiled(x, w, key))
  for a, b in zip(*runs):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
