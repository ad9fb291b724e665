"""The bf16 grouped GEMMs of the Pallas kernels (bf16 x bf16 -> f32, interpret mode on CPU) against
`ragged_dot` on the same bf16 operands: the forward, dX and dW products to the rounding of f32 sums,
exact zeros for empty experts and for padding rows past the sum (a NaN there stays out), and the
bf16 recipe's grouped_qmatmul on the kernels.

The bound: a product of two bf16 values (8 significant bits each) is exact in f32 (24 bits), so
each entry of every path is a sum of the same n exact terms p_c, rounded in f32 in some order. Any
order is within γ(n-1)·Σ|p_c| of the exact sum (γ(m) = m·u/(1 - m·u), u = 2^-24), so two orders
are within 2·γ(n-1)·Σ|p_c| ≤ 2·n·u·Σ|p_c| of each other (for n·(n-1)·u ≤ 1), n the contracted
length (K, N, or T for dW). A GEMM rounding its sums or results to bf16 (u = 2^-8) misses it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r.quant.grouped import gemm as grouped_gemm

T, K, N = 70, 40, 24  # several row tiles; K and N not multiples of the kernels' blocks
ROUTINGS = (
  [20, 0, 37, 0, 6],  # empty experts between segments, 7 padding rows
  [0, 0, 0, 0, 0],  # every row padding
  [T, 0, 0, 0, 0],  # all rows on the first expert
  [0, 0, 0, 0, 61],  # all routed rows on the last expert, 9 padding rows
  [1, 1, 1, 1, 66],  # one-row segments inside the first row tile
)
F32 = jnp.float32


def _gemms(impl, a_TxK, q_TxN, w_ExKxN, sizes):
  lay = grouped_gemm.layout(sizes, T)
  return (
    grouped_gemm.gmm(a_TxK, w_ExKxN, lay, impl, out=F32),
    grouped_gemm.gmm_nt(q_TxN, w_ExKxN, lay, impl, out=F32),
    grouped_gemm.tgmm(a_TxK, q_TxN, lay, impl, out=F32),
  )


_run = jax.jit(_gemms, static_argnums=0)


def _bf16(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)


def _abs_products(a_TxK, q_TxN, w_ExKxN, sizes):
  """Σ_c |p_c| of each entry of the three products and their contracted lengths n, in float64."""
  a, q, w = (np.abs(np.asarray(x, np.float64)) for x in (a_TxK, q_TxN, w_ExKxN))
  e_T = np.repeat(np.arange(len(sizes)), sizes)
  fwd, dx, dw = np.zeros((T, N)), np.zeros((T, K)), np.zeros_like(w)
  for e in range(len(sizes)):
    rows = np.flatnonzero(e_T == e)
    fwd[rows], dx[rows], dw[e] = a[rows] @ w[e], q[rows] @ w[e].T, a[rows].T @ q[rows]
  return (fwd, K), (dx, N), (dw, T)


def test_bf16_kernels_equal_ragged_dot_to_f32_rounding_with_empty_experts_and_padding_rows():
  rng = np.random.default_rng(0)
  a, q, w = _bf16(rng, T, K), _bf16(rng, T, N), _bf16(rng, len(ROUTINGS[0]), K, N)
  for sizes in ROUTINGS:
    routed = sum(sizes)
    gs = jnp.asarray(sizes, jnp.int32)
    want = _run("ragged", a, q, w, gs)
    nan_a, nan_q = a.at[routed:].set(jnp.nan), q.at[routed:].set(jnp.nan)  # padding rows: no product reads them
    got = _run("pallas", nan_a, nan_q, w, gs)
    for name, g, r, (abs_sum, n) in zip(("forward", "dX", "dW"), got, want, _abs_products(a, q, w, sizes), strict=True):
      assert g.dtype == r.dtype == F32 and g.shape == r.shape, name
      err = np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64))
      assert (err <= 2 * n * 2.0**-24 * abs_sum).all(), (name, sizes, float(err.max()))
    assert (np.asarray(got[0][routed:]) == 0).all() and (np.asarray(got[1][routed:]) == 0).all()
    empty = np.asarray(sizes) == 0
    assert (np.asarray(got[2])[empty] == 0).all()


def test_bf16_kernels_are_not_bit_identical_to_a_bf16_rounded_product():
  """The bound above is tight enough to tell an f32 accumulation from one rounded to bf16."""
  rng = np.random.default_rng(1)
  a, q, w = _bf16(rng, T, K), _bf16(rng, T, N), _bf16(rng, 5, K, N)
  gs = jnp.asarray(ROUTINGS[0], jnp.int32)
  got = _run("pallas", a, q, w, gs)
  rounded = [g.astype(jnp.bfloat16).astype(F32) for g in got]
  for (abs_sum, n), g, r in zip(_abs_products(a, q, w, ROUTINGS[0]), got, rounded, strict=True):
    err = np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64))
    assert (err > 2 * n * 2.0**-24 * abs_sum).any()


@pytest.mark.slow
def test_the_bf16_recipe_gives_the_same_outputs_and_gradients_under_pallas_and_ragged_dot():
  """y and dX in bf16 (x's dtype) and dW in f32 (w's): one bf16 rounding of values within the bound apart."""
  rng = np.random.default_rng(2)
  x, g = _bf16(rng, T, K), _bf16(rng, T, N)
  w = jnp.asarray(rng.standard_normal((5, K, N)), F32)
  gs = jnp.asarray(ROUTINGS[0], jnp.int32)

  def fwd_bwd(impl, x, w, g):
    y, vjp = jax.vjp(lambda x, w: s3r.grouped_qmatmul(x, w, gs, key=jax.random.key(0), recipe="bf16", impl=impl), x, w)
    return (y, *vjp(g))

  run = jax.jit(fwd_bwd, static_argnums=0)
  for got, want in zip(run("pallas", x, w, g), run("ragged", x, w, g), strict=True):
    assert got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2.0**-7, atol=2.0**-12)
