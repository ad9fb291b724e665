"""The quantized linear layer Y = X W with an INT8 forward and an INT8, unbiased backward.

Forward (every INT8 recipe): per-token and per-output-channel absmax scales, RTNE codes,
one int8 x int8 -> int32 GEMM, rescale. Backward: both scales are folded into the upstream
gradient, G' = s_x G s_w, which is quantized with one per-tensor step Δ into int8 codes Q;
dX = (Δ/s_x) Q Ŵᵀ and dW = (Δ/s_w) X̂ᵀ Q are two more int8 GEMMs. The recipe decides how
Q is rounded (see recipes.py) and whether S3R-EC corrects the products (see ec.py).

Under tensor parallelism (`tp=`), the GEMM that contracts the split dimension rounds each
shard's partial product to the output dtype before the cross-shard sum (see tensor_parallel.py).

Shapes: x is [..., K] and the output [..., N]. An *example* is one index of x's first axis and
a *token* one row of K features: x [B, S, K] is B examples of S tokens, x [T, K] one example of
T tokens, a vector x [K] one example of one token, and x [B, D1, ..., Dm, K] B examples of
S = D1*...*Dm tokens (the middle axes are flattened). Per-token thresholds and the forward's
per-token scales do not depend on how T = B*S splits into examples; per-example thresholds
(the `_bcast` recipes) and the S3R-EC means (per example) do. An empty x (any dim 0) gives
an empty (or all-zero) output with all-zero gradients.

Keys: the forward never uses the key. A stochastic recipe needs it in the backward pass, so
`key=None` is accepted for forward-only use (evaluation) and a gradient taken through it raises.
The backward is not itself differentiable: a second derivative through an INT8 recipe raises.

Dimension letters: B examples, S tokens per example, T = B*S, K input features, N outputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import ec, numerics, tensor_parallel, thresholds
from s3r.quant.recipes import Recipe
from s3r.quant.recipes import recipe as lookup_recipe

_FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64)


def qmatmul(
  x: jax.Array,
  w: jax.Array,
  *,
  key: jax.Array | None = None,
  recipe: str | Recipe = "s3r_ec_dx",
  tp: str | None = None,
  tp_axis: str = "tensor",
) -> jax.Array:
  """x @ w with the recipe's INT8 forward and backward; returns [..., N] in x's dtype.

  Args:
    x: activations [B, S, K] (B examples of S tokens), [T, K] (one example of T tokens), [K]
      (one token) or [B, D1, ..., Dm, K] (B examples of D1*...*Dm tokens); see the module doc.
    w: weight [K, N] (typically the f32 master weight).
    key: a `jax.random.key` (or raw uint32[2] key) for the backward pass's rounding; needed
      by stochastic recipes when a gradient is taken (None is fine for forward-only use),
      ignored by `bf16`, `int8_rtne` and `int8_exact_bwd`. Use a fresh key per layer and
      step: the same key gives the same thresholds.
    recipe: a `Recipe` or a registered name (see `s3r.RECIPES`).
    tp: how `w` is split over the mesh axis `tp_axis` under tensor parallelism: "row" (along K,
      so the forward GEMM has partial sums) or "column" (along N: the dX GEMM has them), or
      None. When the trace runs under a mesh (`jax.sharding.use_abstract_mesh`) whose `tp_axis`
      has t > 1 shards dividing the split dimension, that GEMM rounds each shard's partial
      product to the output dtype and sums the t partials in it, as the paper's TPU runs do;
      otherwise (and always with None) the partial sums stay exact int32 accumulators.

  A non-finite upstream gradient makes the step Δ non-finite, so dX and dW come out
  non-finite too (never silently zeroed): the trainer's finiteness checks still see it.
  """
  r = _check_recipe(recipe)
  _check_operands(x, w)
  key = _check_key(key, r, required=False)
  if 0 in x.shape or 0 in w.shape:  # nothing to quantize: the exact (empty or all-zero) product
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32)).astype(x.dtype)
  tp_split = tensor_parallel.resolve(tp, tp_axis, w.shape[0] if tp == "row" else w.shape[-1])
  if not r.quantized:
    if tp_split is not None:  # bf16 partial sums per shard for the baseline too
      y = tensor_parallel.bf16_matmul(x.reshape(-1, x.shape[-1]), w, tp_split, np.dtype(x.dtype), np.dtype(w.dtype))
      return y.reshape(x.shape[:-1] + (w.shape[1],))
    y = jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return y.astype(x.dtype)
  y_BxSxN = _qmatmul(r, tp_split, np.dtype(x.dtype), np.dtype(w.dtype), _as_examples(x), w, key)
  return y_BxSxN.reshape(x.shape[:-1] + (w.shape[1],))


def _as_examples(a: jax.Array) -> jax.Array:
  """[..., C] as [B, S, C]: the first axis is the examples, the others flattened into tokens."""
  if a.ndim == 3:
    return a
  if a.ndim < 3:
    return a.reshape((1,) * (3 - a.ndim) + a.shape)
  return a.reshape(a.shape[0], -1, a.shape[-1])


# --- custom VJP: _qmatmul, _fwd, _bwd, defvjp ------------------------------------------------
# A custom VJP because the backward is not the derivative of the forward: it re-quantizes
# the upstream gradient and runs int8 GEMMs on the saved int8 operands.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _qmatmul(r, tp, x_dtype, w_dtype, x_BxSxK, w_KxN, key):
  return _fwd(r, tp, x_dtype, w_dtype, x_BxSxK, w_KxN, key)[0]


def _fwd(r, tp, x_dtype, w_dtype, x_BxSxK, w_KxN, key):
  del r, w_dtype
  batch, seq, k = x_BxSxK.shape
  sx_BxS = numerics.absmax_scale(x_BxSxK, axis=2)
  sw_N = numerics.absmax_scale(w_KxN, axis=0)
  xq_TxK = numerics.quantize_rtne(x_BxSxK, sx_BxS[:, :, None]).reshape(batch * seq, k)
  wq_KxN = numerics.quantize_rtne(w_KxN, sw_N[None, :])

  def rescale(acc_TxN):
    return acc_TxN * sx_BxS.reshape(-1, 1) * sw_N

  if tp is not None and tp.kind == "row":
    y_TxN = tensor_parallel.split_contraction(xq_TxK, wq_KxN, tp, b_transposed=False, rescale=rescale, dtype=x_dtype)
  else:
    y_TxN = rescale(numerics.int8_matmul(xq_TxK, wq_KxN).astype(jnp.float32)).astype(x_dtype)
  y_BxSxN = y_TxN.reshape(batch, seq, -1)
  # X̂ is saved transposed so that dW = X̂ᵀ Q contracts the tokens in the fast GEMM layout.
  xqT_KxT = numerics.materialized_transpose(xq_TxK, sx_BxS[0, 0])
  return y_BxSxN, (xqT_KxT, wq_KxN, sx_BxS, sw_N, key)


def _bwd(r, tp, x_dtype, w_dtype, res, g_BxSxN):
  if r.stochastic and res[-1] is None:
    raise ValueError(
      f"qmatmul: recipe {r.name!r} rounds the gradient stochastically and needs a key in the backward "
      "pass, but the forward ran with key=None. Pass key=jax.random.key(...) to s3r.qmatmul (a fresh "
      "one per layer and step); with s3r.nn's Linen adapters pass rngs={'quant': step_key} to apply() "
      "and, under nn.scan/nn.vmap, name 'quant' in split_rngs (a stream not named there does not reach "
      "the layers); NNX adapters draw from their own 'quant' stream. Forward-only use needs no key."
    )
  return _backward(r, tp, x_dtype, w_dtype, res, g_BxSxN)


_qmatmul.defvjp(_fwd, _bwd)


# The backward quantizes the upstream gradient (rounding, clipping, int8 casts): its JAX
# derivative exists but is not the derivative of anything meaningful, so differentiating it
# (grad of grad, jax.hessian, jvp of a gradient) raises instead of returning those numbers.
@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3))
def _backward(r, tp, x_dtype, w_dtype, res, g_BxSxN):
  xqT_KxT, wq_KxN, sx_BxS, sw_N, key = res
  batch, seq = sx_BxS.shape
  n = wq_KxN.shape[1]
  if r.rounding == "exact":
    return _exact_bwd(x_dtype, w_dtype, res, g_BxSxN)
  delta, v_BxSxN, q_dx, q_dw = quantize_gradient(r, sx_BxS, sw_N, g_BxSxN, key)

  factors = None
  if r.correct_dx or r.correct_dw:
    # e = Q - G'/Δ, the rounding error in units of Δ (EC recipes never split: q_dx is q_dw)
    factors = ec.error_factors(q_dx.astype(jnp.float32) - v_BxSxN)
  dx_TxK = _dx(r, tp, x_dtype, q_dx.reshape(-1, n), wq_KxN, (delta / sx_BxS).reshape(-1, 1), factors)
  acc_dw_KxN = numerics.int8_matmul(xqT_KxT, q_dw.reshape(-1, n)).astype(jnp.float32)
  if r.correct_dw:
    acc_dw_KxN = acc_dw_KxN - ec.dw_correction(*factors, xqT_KxT)
  dw_KxN = acc_dw_KxN * (delta / sw_N)
  return dx_TxK.reshape(batch, seq, -1), dw_KxN.astype(w_dtype), None


@_backward.defjvp
def _backward_jvp(r, tp, x_dtype, w_dtype, primals, tangents):
  del tp, x_dtype, w_dtype, primals, tangents
  raise NotImplementedError(
    f"qmatmul: higher-order derivatives through recipe {r.name!r} are not defined: its backward pass "
    "quantizes the gradient and is not differentiable (grad of grad, jax.hessian and jvp of a gradient "
    "all differentiate it). Use recipe='bf16' for the part differentiated twice, or wrap it in "
    "jax.lax.stop_gradient."
  )


def _dx(r: Recipe, tp, x_dtype, q_TxN, wq_KxN, scale_Tx1, factors) -> jax.Array:
  """dX [T, K] in x's dtype: (Δ/s_x) (Q Ŵᵀ - the S3R-EC correction, for recipes that correct dX).

  Under column tensor parallelism the GEMM's per-shard partial products are rounded and
  summed first, and the correction (built from small factors) is subtracted from that sum.
  """
  correction_TxK = ec.dx_correction(*factors, wq_KxN).reshape(q_TxN.shape[0], -1) if r.correct_dx else None
  if tp is None or tp.kind != "column":
    acc_TxK = numerics.int8_matmul_nt(q_TxN, wq_KxN).astype(jnp.float32)
    if correction_TxK is not None:
      acc_TxK = acc_TxK - correction_TxK
    return (acc_TxK * scale_Tx1).astype(x_dtype)
  dx_TxK = tensor_parallel.split_contraction(
    q_TxN, wq_KxN, tp, b_transposed=True, rescale=lambda acc: acc * scale_Tx1, dtype=x_dtype
  )
  if correction_TxK is None:
    return dx_TxK
  return (dx_TxK.astype(jnp.float32) - correction_TxK * scale_Tx1).astype(x_dtype)


def quantize_gradient(
  r: str | Recipe, sx_BxS: jax.Array, sw_N: jax.Array, g_BxSxN: jax.Array, key: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(Δ, G'/Δ, Q for dX, Q for dW): the backward's quantization of the upstream gradient.

  The code path of `qmatmul`'s backward (benchmarks and diagnostics call it directly):
  G' = s_x G s_w with the forward's activation scales `sx_BxS` and weight scales `sw_N`,
  one step Δ, then the recipe's rounding of G'/Δ into int8 codes (one array returned twice
  unless the recipe splits). `key` is a typed key; stochastic recipes need it.

  Δ = max|G'|/127 is one per-tensor step: under sharding, the max over all shards (XLA
  inserts one scalar all-reduce), so it does not depend on the device mesh.
  """
  r = _check_recipe(r)
  gp_BxSxN = sx_BxS[:, :, None] * g_BxSxN.astype(jnp.float32) * sw_N
  delta = numerics.gradient_step(jnp.max(jnp.abs(gp_BxSxN)))
  v_BxSxN = gp_BxSxN * numerics.reciprocal(delta)  # never a division: see numerics.quantize_rtne
  q_dx, q_dw = _round(r, v_BxSxN, key)
  return delta, v_BxSxN, q_dx, q_dw


def gradient_codes(
  x: jax.Array, w: jax.Array, g: jax.Array, *, key: jax.Array | None = None, recipe: str | Recipe = "s3r"
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(Q for dX, Q for dW, Δ): the int8 codes and step that the backward of `qmatmul(x, w)`
  makes of the upstream gradient `g` ([..., N], the shape of the output). Same code path as
  the backward pass (for tests and diagnostics); one Q returned twice unless the recipe splits.
  """
  r = _check_recipe(recipe)
  _check_operands(x, w)
  key = _check_key(key, r, required=True)
  if not r.int8_backward:
    raise ValueError(f"gradient_codes: recipe {r.name!r} does not quantize the gradient")
  sx_BxS = numerics.absmax_scale(_as_examples(x), axis=2)
  sw_N = numerics.absmax_scale(w, axis=0)
  delta, _, q_dx, q_dw = quantize_gradient(r, sx_BxS, sw_N, _as_examples(g), key)
  shape = x.shape[:-1] + (w.shape[1],)
  return q_dx.reshape(shape), q_dw.reshape(shape), delta


def _exact_bwd(x_dtype, w_dtype, res, g_BxSxN):
  """G Ŵ_deqᵀ and X̂_deqᵀ G in f32: the exact gradient of the executed INT8 forward graph."""
  xqT_KxT, wq_KxN, sx_BxS, sw_N, _ = res
  g_TxN = g_BxSxN.astype(jnp.float32).reshape(-1, wq_KxN.shape[1])
  hi = jax.lax.Precision.HIGHEST
  dx_TxK = jnp.matmul(g_TxN, (wq_KxN.astype(jnp.float32) * sw_N).T, precision=hi)
  dw_KxN = jnp.matmul(xqT_KxT.astype(jnp.float32) * sx_BxS.reshape(1, -1), g_TxN, precision=hi)
  return dx_TxK.reshape(g_BxSxN.shape[:2] + (-1,)).astype(x_dtype), dw_KxN.astype(w_dtype), None


def _round(r: Recipe, v_BxSxN: jax.Array, key) -> tuple[jax.Array, jax.Array]:
  """int8 codes (Q for dX, Q for dW) of v = G'/Δ: one array, returned twice, unless split."""
  codes = functools.partial(numerics.round_codes, v_BxSxN)
  if r.rounding == "rtne":
    q = codes(None)
    return q, q
  batch, seq, _ = v_BxSxN.shape
  if r.rounding == "sr":
    key_dx, key_dw = jax.random.split(key)
    return (codes(jax.random.uniform(key_dx, v_BxSxN.shape)), codes(jax.random.uniform(key_dw, v_BxSxN.shape)))
  if not r.split:
    q = codes(thresholds.shared_thresholds(key, batch, seq, r.dx_topology))
    return q, q
  key_dx, key_dw = jax.random.split(key)
  return (
    codes(thresholds.shared_thresholds(key_dx, batch, seq, r.dx_topology)),
    codes(thresholds.shared_thresholds(key_dw, batch, seq, r.dw_topology)),
  )


# --- argument checks (trace time) ------------------------------------------------------------


def _check_recipe(recipe) -> Recipe:
  if isinstance(recipe, Recipe):
    return recipe
  if isinstance(recipe, str):
    return lookup_recipe(recipe)
  raise TypeError(f"qmatmul: recipe must be a s3r.Recipe or a recipe name (str), got {type(recipe).__name__}")


def _describe(a) -> str:
  return f"shape {tuple(a.shape)} dtype {a.dtype}"


def _check_operands(x, w) -> None:
  for name, a in (("x", x), ("w", w)):
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
      raise TypeError(f"qmatmul: {name} must be an array, got {type(a).__name__}")
    if not any(a.dtype == f for f in _FLOATS):
      raise TypeError(
        f"qmatmul: {name} must have a real floating dtype (bfloat16, float16, float32), got {_describe(a)}"
      )
  if x.ndim < 1:
    raise ValueError(f"qmatmul: x must be [..., K] (at least one dim), got {_describe(x)}")
  if w.ndim != 2:
    raise ValueError(f"qmatmul: w must be [K, N], got {_describe(w)}")
  if x.shape[-1] != w.shape[0]:
    raise ValueError(
      f"qmatmul: the last dim of x ({x.shape[-1]}) must equal the first dim of w "
      f"({w.shape[0]}); x has {_describe(x)}, w has {_describe(w)}"
    )


def _check_key(key, r: Recipe, *, required: bool):
  """The key as a typed key; None when the recipe needs none (or, unless `required`, none was given)."""
  if not r.stochastic or (key is None and not required):
    return None
  if key is None:
    raise ValueError(f"qmatmul: recipe {r.name!r} rounds stochastically and needs key=jax.random.key(...), got None")
  if not hasattr(key, "dtype"):
    raise TypeError(f"qmatmul: key must be a jax.random.key array, got {type(key).__name__}")
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"qmatmul: key must be a single key (shape ()), got shape {tuple(key.shape)}")
    return key
  if key.dtype == jnp.uint32 and key.shape == (2,):
    return jax.random.wrap_key_data(key)
  raise TypeError(f"qmatmul: key must be a jax.random.key (or a raw uint32[2] key), got {_describe(key)}")
