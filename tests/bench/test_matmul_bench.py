"""The fast-layout bf16 reference of `python -m benchmarks matmul` computes the bf16 layer's gradients."""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import matmul


def test_fast_layout_bf16_matches_autodiff_of_the_bf16_layer():
  x = jax.random.normal(jax.random.key(0), (64, 32), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (32, 48)) * 0.1
  g = jax.random.normal(jax.random.key(2), (64, 48), jnp.bfloat16)
  mm = matmul.fast_layout_bf16()
  y, vjp = jax.vjp(mm, x, w)
  dx, dw = vjp(g)
  f = lambda x, w: jnp.matmul(x.astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32))
  y_ref, vjp_ref = jax.vjp(f, x, w)
  dx_ref, dw_ref = vjp_ref(g.astype(jnp.float32))
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(y_ref), rtol=1e-2, atol=1e-2)
  np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx_ref), rtol=1e-2, atol=1e-2)
  # autodiff rounds dW to bf16 on the way back through the cast; ours stays f32
  np.testing.assert_allclose(np.asarray(dw), np.asarray(dw_ref), rtol=2**-7, atol=1e-3)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
