"""grouped_qmatmul with the E4M3 forward (`NAME+fwd_e4m3`): the forward is the ragged product of the
dense layer's E4M3 codes, one segment per example gives the dense layer's outputs and gradients at
int8 and FP8 gradient formats, every GEMM of the all-FP8 recipe takes FP8 operands, and what the
grouped path still does not take (block-scaled FP4 gradients) is refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r.quant.formats import FORMATS
from tests.quant.reference import np_e4m3_codes, np_e4m3_scale
from tests.quant.test_grouped import (
  SIZES,
  N,
  T,
  _dense_and_one_segment_per_example,
  _problem,
  _run,
  _segments,
  test_empty_experts_and_padding_rows_get_zero_outputs_and_gradients_never_nan,
)

IMPLS = ("tiled", "ragged", "pallas")  # "pallas" (and the default "auto") route the FP8 GEMMs to tiled and ragged
ALL_FP8 = "s3r_ec_dx@e5m2+fwd_e4m3"


@pytest.mark.parametrize("impl", IMPLS)
def test_e4m3_forward_is_the_ragged_product_of_the_e4m3_codes(impl):
  """Per-row and per-(expert, column) scales onto 448, nearest-even E4M3 codes (the NumPy cast), the
  product of the codes rescaled: to f32 rounding of the K-long sums; empty experts and padding rows 0."""
  x, w, _ = _problem()
  y = np.asarray(_run(ALL_FP8, x, w, SIZES, jnp.zeros((T, N)), impl)[0], np.float64)
  xn, wn = np.asarray(x), np.asarray(w)
  sx, sw = np_e4m3_scale(xn, axis=1), np_e4m3_scale(wn, axis=1)
  xq, wq = np_e4m3_codes(xn, sx[:, None]), np_e4m3_codes(wn, sw[:, None, :])
  expected = np.zeros_like(y)
  for e, a, b in _segments(SIZES):
    expected[a:b] = (xq[a:b].astype(np.float64) @ wq[e].astype(np.float64)) * sx[a:b, None] * sw[e]
  np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
  assert (y[sum(SIZES) :] == 0).all()


@pytest.mark.parametrize(
  "recipe",
  [
    "int8_rtne+fwd_e4m3",
    "int8_sr+fwd_e4m3",
    "s3r_ec_dx+fwd_e4m3",
    ALL_FP8,
    "s3r_ec@e4m3+fwd_e4m3",
    pytest.param("s3r_ec_dx_bcast@e5m2+fwd_e4m3", marks=pytest.mark.slow),
    pytest.param("int8_exact_bwd+fwd_e4m3", marks=pytest.mark.slow),
  ],
)
def test_one_segment_per_example_with_a_shared_weight_gives_the_dense_layer_with_the_e4m3_forward(recipe):
  """E = B segments of S rows, every expert holding the same W, as for the int8 forward: the same E4M3
  codes and scales, the same step, thresholds and gradient codes Q. The forward is bit-exact: both
  paths sum the same exact E4M3 products (8 significant bits, exact in f32) of a row in f32 in the same
  order of K on XLA:CPU. dX (Q Ŵᵀ, and S3R-EC's bf16 correction GEMM) and dW (E per-expert f32 products
  summed, where the dense layer rescales one sum) agree to f32 rounding of the accumulated magnitudes."""
  for impl in IMPLS:
    (y_d, dx_d, dw_d), (y_g, dx_g, dw_g) = _dense_and_one_segment_per_example(recipe, impl)
    np.testing.assert_array_equal(y_g, y_d)
    np.testing.assert_allclose(dx_g, dx_d, rtol=0, atol=1e-6 * np.abs(dx_d).max())
    np.testing.assert_allclose(dw_g, dw_d, rtol=0, atol=1e-6 * np.abs(dw_d).max())


def test_empty_experts_and_padding_rows_stay_zero_and_finite_with_the_e4m3_forward():
  """A NaN or an Inf in a padding row gives a NaN E4M3 code there (int8 codes have none): it still
  reaches no output, no dX row and no dW."""
  for recipe in (ALL_FP8, "s3r_ec+fwd_e4m3"):
    test_empty_experts_and_padding_rows_get_zero_outputs_and_gradients_never_nan(recipe)


def _gemm_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
  """The operand dtypes of every dot_general and ragged_dot_general in a jaxpr and the jaxprs it calls
  (the branches of a platform_dependent choice included)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "ragged_dot_general"):
      found.append(tuple(str(v.aval.dtype) for v in eqn.invars[:2]))
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += _gemm_operand_dtypes(inner)
  return found


@pytest.mark.parametrize("impl", [None, "tiled", "ragged"])
def test_the_all_fp8_grouped_gemms_take_fp8_operands(impl):
  """Forward X̂Ŵ_e (E4M3 x E4M3), dX QŴ_eᵀ (E5M2 x E4M3) and dW X̂_eᵀQ_e (E4M3 x E5M2) reach their dots
  as FP8 operands, the form XLA:GPU can run as FP8 tensor-core GEMMs; S3R-EC's dX correction is a bf16
  GEMM, as in the dense layer. Under the default every branch of the CUDA/other-platform choice is
  in the program, so this holds for the GPU program too."""
  x, w, _ = _problem()
  gs = jnp.asarray(SIZES, jnp.int32)
  f = lambda x, w: jnp.sum(s3r.grouped_qmatmul(x, w, gs, key=jax.random.key(0), recipe=ALL_FP8, impl=impl))
  gemms = set(_gemm_operand_dtypes(jax.make_jaxpr(jax.grad(f, (0, 1)))(x, w).jaxpr))
  fp8 = {("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2")}
  assert gemms == fp8 | {("bfloat16", "bfloat16")}, gemms


@pytest.mark.parametrize("grad_format", [n for n, f in FORMATS.items() if not f.capabilities.grouped])
def test_fp4_gradients_with_the_e4m3_forward_are_refused_on_the_grouped_path_naming_the_format(grad_format):
  x, w, _ = _problem()
  with pytest.raises(ValueError, match=f"gradient format '{grad_format}'.*grouped"):
    s3r.grouped_qmatmul(
      x, w, jnp.asarray(SIZES, jnp.int32), key=jax.random.key(0), recipe=f"s3r_ec_dx@{grad_format}+fwd_e4m3"
    )
