"""The Pallas grouped GEMMs (interpret mode on CPU) against the ragged_dot reference, bit for bit:
the int32 forward, dX and dW products, the fused dequantize epilogues, and grouped_qmatmul's
outputs and gradients, on empty experts, all rows on one expert, padding rows past the sum,
T = 1, E = 1 and sizes that are not multiples of the tiles and blocks; the impl choice."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core

import s3r
from labtools.analysis.hlo import hlo_text
from s3r.quant.grouped import gemm as grouped_gemm
from s3r.quant.grouped import pallas as grouped_pallas

T, K, N, E = 13, 8, 6, 4
ROUTINGS = (
  [3, 0, 5, 2],
  [T, 0, 0, 0],
  [0, 0, 0, T],
  [0, 0, 0, 0],
  [1, 1, 1, 10],
  [2, 3, 0, 1],
)  # padding: 3, 0, 0, 13, 0, 7


def _codes(rng, *shape):
  return jnp.asarray(rng.integers(-127, 128, shape), jnp.int8)


def _scales(rng, *shape):
  return jnp.asarray(rng.uniform(1e-3, 1.0, shape), jnp.float32)


def _int32_gemms(impl, a_TxK, q_TxN, w_ExKxN, sizes):
  lay = grouped_gemm.layout(sizes, a_TxK.shape[0])
  return (
    grouped_gemm.gmm(a_TxK, w_ExKxN, lay, impl),
    grouped_gemm.gmm_nt(q_TxN, w_ExKxN, lay, impl),
    grouped_gemm.tgmm(a_TxK, q_TxN, lay, impl),
  )


def _fused_gemms(impl, a_TxK, q_TxN, w_ExKxN, sizes, row_T, col_ExN, col_ExK, sub_TxK, sub_ExKxN):
  """The three GEMMs with the epilogues grouped_qmatmul uses (bf16 forward, f32 gradients)."""
  lay = grouped_gemm.layout(sizes, a_TxK.shape[0])
  return (
    grouped_gemm.gmm_epilogue(a_TxK, w_ExKxN, lay, impl, row_T=row_T, col_ExN=col_ExN, out=jnp.bfloat16),
    grouped_gemm.gmm_nt_epilogue(q_TxN, w_ExKxN, lay, impl, sub_TxK=sub_TxK, row_T=row_T, out=jnp.float32),
    grouped_gemm.tgmm_epilogue(a_TxK, q_TxN, lay, impl, sub_ExKxN=sub_ExKxN, col_ExN=col_ExK, out=jnp.float32),
  )


_int32 = jax.jit(_int32_gemms, static_argnums=0)
_fused = jax.jit(_fused_gemms, static_argnums=0)


def _assert_bitwise_equal(got, want):
  for g, w in zip(got, want, strict=True):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g.astype(jnp.float32)), np.asarray(w.astype(jnp.float32)))


def test_fused_epilogue_gemms_equal_ragged_dot_bit_for_bit_on_every_routing():
  rng = np.random.default_rng(0)
  a, q, w = _codes(rng, T, K), _codes(rng, T, N), _codes(rng, E, K, N)
  row, col_n, col_k = _scales(rng, T), _scales(rng, E, N), _scales(rng, E, N)
  row = row.at[-1].set(jnp.nan)  # a NaN scale on a row that is padding in most routings
  sub_t, sub_e = 100 * _scales(rng, T, K), 100 * _scales(rng, E, K, N)
  for sizes in ROUTINGS:
    gs = jnp.asarray(sizes, jnp.int32)
    want = _fused("ragged", a, q, w, gs, row, col_n, col_k, sub_t, sub_e)
    got = _fused("pallas", a, q, w, gs, row, col_n, col_k, sub_t, sub_e)
    _assert_bitwise_equal(got, want)
    padding = slice(sum(sizes), T)
    assert (np.asarray(got[0][padding]) == 0).all() and (np.asarray(got[1][padding]) == 0).all()


@pytest.mark.parametrize(
  "t, k, n, sizes",
  [
    (1, 8, 6, [1]),  # T = 1, E = 1
    (13, 8, 6, [9]),  # E = 1 with 4 padding rows
    (1, 8, 6, [0, 1, 0]),  # T = 1 between empty experts
    (300, 70, 40, [70, 0, 129, 1, 64]),  # many row tiles, segments ending inside tiles, K and N not block multiples
  ],
)
def test_int32_gemms_equal_ragged_dot_bit_for_bit_on_edge_shapes(t, k, n, sizes):
  rng = np.random.default_rng(t + k)
  a, q, w = _codes(rng, t, k), _codes(rng, t, n), _codes(rng, len(sizes), k, n)
  gs = jnp.asarray(sizes, jnp.int32)
  got = _int32("pallas", a, q, w, gs)
  _assert_bitwise_equal(got, _int32("ragged", a, q, w, gs))
  assert (np.asarray(got[0][sum(sizes) :]) == 0).all() and (np.asarray(got[1][sum(sizes) :]) == 0).all()


def test_extreme_codes_accumulate_exactly_in_int32():
  """All codes ±127 over 300 rows of one expert: dW entries reach 300·127², exact only in int32."""
  t, sizes = 300, [0, 300]
  a = jnp.full((t, K), 127, jnp.int8)
  q = jnp.full((t, N), -127, jnp.int8)
  w = jnp.full((2, K, N), 127, jnp.int8)
  got = _int32("pallas", a, q, w, jnp.asarray(sizes, jnp.int32))
  np.testing.assert_array_equal(got[2][1], np.full((K, N), -300 * 127 * 127))
  np.testing.assert_array_equal(got[2][0], 0)
  np.testing.assert_array_equal(got[0], np.full((t, N), K * 127 * 127))


def _fwd_bwd(recipe, impl, x, w, sizes, g, key):
  y, vjp = jax.vjp(lambda a, b: s3r.grouped_qmatmul(a, b, sizes, key=key, recipe=recipe, impl=impl), x, w)
  return (y, *vjp(g))


_qmatmul = jax.jit(_fwd_bwd, static_argnums=(0, 1))


def _problem(seed, dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((T, K)), dtype).at[-1].set(jnp.nan)  # a NaN padding row stays out
  w = jnp.asarray(rng.standard_normal((E, K, N)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((T, N)), dtype)
  return x, w, g


def test_grouped_qmatmul_outputs_and_gradients_are_identical_with_pallas_and_the_default():
  x, w, g = _problem(seed=1)
  key = jax.random.key(7)
  for sizes in ROUTINGS[:4] + ([2, 3, 0, 1],):
    if sum(sizes) == T:
      continue  # the NaN row would be routed
    gs = jnp.asarray(sizes, jnp.int32)
    got = _qmatmul("s3r_ec_dx", "pallas", x, w, gs, g, key)
    _assert_bitwise_equal(got, _qmatmul("s3r_ec_dx", None, x, w, gs, g, key))
    assert np.isfinite(np.asarray(got[1].astype(jnp.float32))).all()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [n for n, r in s3r.RECIPES.items() if r.quantized_gradient])
def test_every_int8_recipe_is_identical_with_pallas_and_ragged_dot(recipe):
  x, w, g = _problem(seed=2, dtype=jnp.float32)
  for sizes in ([3, 0, 5, 2], [0, 0, 0, 0], [1, 1, 1, 9]):
    gs = jnp.asarray(sizes, jnp.int32)
    got = _qmatmul(recipe, "pallas", x, w, gs, g, jax.random.key(3))
    _assert_bitwise_equal(got, _qmatmul(recipe, "ragged", x, w, gs, g, jax.random.key(3)))


def _pallas_calls(impl, recipe="s3r_ec_dx"):
  """(name, interpret) of every pallas_call in the jaxpr of grouped_qmatmul's forward and backward."""
  x, w, g = _problem(seed=0)
  jaxpr = jax.make_jaxpr(lambda *a: _fwd_bwd(recipe, impl, *a))(x, w, jnp.zeros((E,), jnp.int32), g, jax.random.key(0))

  def walk(j):
    for eqn in getattr(j, "jaxpr", j).eqns:
      if eqn.primitive.name == "pallas_call":
        yield eqn.params["name"], bool(eqn.params["interpret"])
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
            yield from walk(sub)

  return sorted(walk(jaxpr))


def test_pallas_runs_three_kernels_compiled_on_gpu_and_interpreted_elsewhere():
  compiled = [("s3r_grouped_gmm", False)] * 2 + [("s3r_grouped_tgmm", False)]
  interpreted = [(name, True) for name, _ in compiled]
  assert _pallas_calls("pallas") == sorted(compiled + interpreted)
  assert _pallas_calls("auto") == sorted(compiled)  # elsewhere: the tiled path
  assert _pallas_calls(None) == sorted(compiled)  # the default is "auto"
  assert _pallas_calls("tiled") == []
  assert _pallas_calls("pallas", recipe="bf16") == sorted(compiled + interpreted)  # bf16 x bf16 -> f32 kernels
  assert _pallas_calls("auto", recipe="bf16") == sorted(compiled)
  assert _pallas_calls("pallas", recipe="int8_exact_bwd") == sorted(compiled[:1] + interpreted[:1])  # f32 bwd: tiled


def test_auto_equals_the_tiled_path_on_cpu():
  x, w, g = _problem(seed=4)
  gs = jnp.asarray([3, 0, 5, 2], jnp.int32)
  key = jax.random.key(5)
  _assert_bitwise_equal(_qmatmul("s3r", "auto", x, w, gs, g, key), _qmatmul("s3r", "tiled", x, w, gs, g, key))


def _cpu_program(recipe, impl):
  """The compiled CPU program of grouped_qmatmul's forward and backward, without debug locations."""
  x, w, g = _problem(seed=0)
  lowered = _qmatmul.lower(recipe, impl, x, w, jnp.asarray([3, 0, 5, 2], jnp.int32), g, jax.random.key(0))
  text = hlo_text(lowered.compile()).split("FileNames")[0]  # the stack-frame tables name source lines
  return re.sub(r"metadata=\{[^}]*\}|,?\s*stack_frame_id=\d+", "", text)


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "bf16", "int8_exact_bwd"])
def test_the_default_compiles_on_cpu_to_the_tiled_program(recipe):
  """impl=None is "auto": the CUDA branches (kernels, a float dW on ragged_dot) are not lowered here."""
  assert _cpu_program(recipe, None) == _cpu_program(recipe, "tiled")


@pytest.mark.parametrize("impl", ["auto", "pallas"])
def test_a_float_dw_under_the_kernel_impls_is_ragged_dot_on_cuda_and_the_tiled_loop_elsewhere(impl):
  a, q = jax.ShapeDtypeStruct((T, K), jnp.float32), jax.ShapeDtypeStruct((T, N), jnp.float32)
  sizes = jax.ShapeDtypeStruct((E,), jnp.int32)
  hi = jax.lax.Precision.HIGHEST
  dw = lambda impl: jax.jit(
    lambda a, q, s: grouped_gemm.tgmm(a, q, grouped_gemm.layout(s, T), impl, out=jnp.float32, precision=hi)
  )

  def lowered(impl, platform):
    return dw(impl).trace(a, q, sizes).lower(lowering_platforms=(platform,)).as_text()

  cuda, cpu = lowered(impl, "cuda"), lowered(impl, "cpu")
  assert "ragged_dot" in cuda and "stablehlo.while" not in cuda
  assert "ragged_dot" not in cpu and "stablehlo.while" in cpu and "triton" not in cpu


@pytest.mark.parametrize("impl", ["triton", "Pallas", ""])
def test_unknown_impl_raises_naming_the_choices(impl):
  x, w, _ = _problem(seed=0)
  with pytest.raises(ValueError, match="impl must be one of .*'auto', 'pallas', 'ragged', 'tiled'"):
    s3r.grouped_qmatmul(x, w, jnp.asarray([1, 1, 1, 1], jnp.int32), key=jax.random.key(0), impl=impl)


def test_row_tile_is_a_power_of_two_within_bounds():
  for rows, experts in ((1, 1), (13, 4), (300, 5), (32768, 128), (96, 64)):
    tile = grouped_pallas.row_tile(rows, experts)
    assert tile & (tile - 1) == 0 and grouped_pallas.ROW_TILE[0] <= tile <= grouped_pallas.ROW_TILE[1]
