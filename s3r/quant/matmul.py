"""The quantized linear layer Y = X W with an INT8 (or FP8) forward and an unbiased quantized backward.

Forward (every quantized recipe): per-token and per-output-channel absmax scales, RTNE codes of
the recipe's forward format, one GEMM on codes, rescale: int8 x int8 -> int32 by default, E4M3 x
E4M3 -> f32 for an all-FP8 recipe (`Recipe.forward_format`; the scales map max|x| onto 448 and are
applied after the GEMM, as the int8 ones are). Backward: both scales are folded into the upstream
gradient, G' = s_x G s_w, which is quantized with one per-tensor step Δ into codes Q of the
recipe's gradient format (formats/); dX = (Δ/s_x) Q Ŵᵀ and dW = (Δ/s_w) X̂ᵀ Q are two more
GEMMs on codes (`formats.code_dot_general`): int8 x int8 -> int32 for the uniform grids (int8, int6,
int4) with the int8 forward; FP8 x FP8 -> f32 for FP8 gradients with the E4M3 forward (native FP8
GEMMs on Hopper, f32 emulations on the CPU); exact f32 emulations for every mixed pair (FP8 or the
block-scaled FP4 grids nvfp4 and mxfp4, whose Q holds code · s_blk in units of Δ, times int8 codes).
One quantization (with square blocks for FP4) feeds both GEMMs. The recipe decides how Q is rounded
(see recipes.py) and whether S3R-EC corrects the products (see ec.py). `scale_gradient` and `round_gradient` are the
quantizer of the grouped layer too (grouped/matmul.py).

Under tensor parallelism (`tp=`), the GEMM that contracts the split dimension rounds each
shard's partial product to the output dtype before the cross-shard sum (see tensor_parallel.py).

Shapes: x is [..., K] and the output [..., N]. An *example* is one index of x's first axis and
a *token* one row of K features: x [B, S, K] is B examples of S tokens, x [T, K] one example of
T tokens, a vector x [K] one example of one token, and x [B, D1, ..., Dm, K] B examples of
S = D1*...*Dm tokens (the middle axes are flattened). Per-token thresholds and the forward's
per-token scales do not depend on how T = B*S splits into examples; per-example thresholds
(the `_bcast` recipes) and the S3R-EC means (per example) do. An empty x (any dim 0) gives
an empty (or all-zero) output with all-zero gradients.
Under `jax.vmap` mapping x only (one weight, one key), the mapped calls run as one call on the
stacked x, the mapped axis first: its examples are read from that shape (see vmapped.py).

Keys: the forward never uses the key. A stochastic recipe needs it in the backward pass, so
`key=None` is accepted for forward-only use (evaluation) and a gradient taken through it raises.
The backward is not itself differentiable: a second derivative through an INT8 recipe raises.

Dimension letters: B examples, S tokens per example, T = B*S, K input features, N outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import (
  arguments,
  backward,
  bf16,
  ec,
  explicit,
  formats,
  numerics,
  reductions,
  tensor_parallel,
  thresholds,
  vmapped,
)
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe
from s3r.quant.tensor_parallel import TensorParallel

# draw(key, topology): rounding thresholds broadcastable against G'/Δ (see `round_gradient`)
Draw = Callable[[jax.Array, thresholds.Topology], jax.Array]


def qmatmul(
  x: jax.Array,
  w: jax.Array,
  *,
  key: jax.Array | None = None,
  recipe: str | Recipe = DEFAULT_RECIPE,
  tp: str | None = None,
  tp_axis: str = "tensor",
  compute_dtype=None,
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
    compute_dtype: the operand dtype of the unquantized recipe (`bf16`): None or bfloat16 (bf16
      operands and f32 accumulation in the forward, dX and dW GEMMs; see bf16.py), or float32
      (f32 operands at full precision, e.g. a float32 evaluation; its partial sums under `tp`
      stay exact). The INT8 recipes ignore it.

  Under a mesh with Explicit axes (`jax.set_mesh`), the result is sharded as `x @ w` would be
  (x's leading dims, w's N unless x uses its mesh axis) and the gradients as x and w.

  A non-finite upstream gradient makes the step Δ non-finite, so dX and dW come out
  non-finite too (never silently zeroed): the trainer's finiteness checks still see it.
  """
  recipe, key = arguments.check("qmatmul", recipe, key, x, w, key_required=False)
  settings = dict(recipe=recipe, tp=tp, tp_axis=tp_axis, compute_dtype=compute_dtype)
  if vmapped.mapped(x, w, key):  # under jax.vmap: one batched call (see vmapped.py)
    body = lambda x, w, key: _qmatmul_call(x, w, key, **settings)
    return vmapped.call(body, lambda x, w, key: qmatmul(x, w, key=key, **settings), x, w, key)
  return _qmatmul_call(x, w, key, **settings)


def _qmatmul_call(x, w, key, *, recipe: Recipe, tp, tp_axis, compute_dtype) -> jax.Array:
  """qmatmul for one call, its arguments checked."""
  if explicit.explicit_axes():  # sharding in types: the internals run with Auto axes (see explicit.py)
    body = functools.partial(qmatmul, recipe=recipe, tp=tp, tp_axis=tp_axis, compute_dtype=compute_dtype)
    return explicit.run_auto(lambda x, w, key: body(x, w, key=key), explicit.matmul_spec(x, w), x, w, key)
  operands = arguments.compute_dtype("qmatmul", compute_dtype)
  if 0 in x.shape or 0 in w.shape:  # nothing to quantize: the exact (empty or all-zero) product
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32)).astype(x.dtype)
  tp_split = tensor_parallel.resolve(tp, tp_axis, w.shape[0] if tp == "row" else w.shape[-1])
  if tp_split is not None and tp_split.kind == "column" and recipe.quantized_gradient:
    if recipe.forward_format != formats.INT8.name:
      raise ValueError(
        f"qmatmul: forward format {recipe.forward_format!r} (recipe {recipe.name!r}) is not supported with "
        "tp='column' under a split tensor axis: the dX GEMM's per-shard partial sums run on int8 forward codes only"
      )
    if not formats.get_format(recipe.grad_format).capabilities.column_tp:  # one device: nothing to refuse
      raise ValueError(
        f"qmatmul: gradient format {recipe.grad_format!r} (recipe {recipe.name!r}) is not supported with "
        "tp='column' under a split tensor axis: the dX GEMM's per-shard partial sums run on integer codes only; "
        f"use one of {', '.join(formats.formats_with('column_tp'))}"
      )
  if not recipe.quantized and operands == np.float32:
    y = jnp.matmul(x.astype(operands), w.astype(operands), precision=arguments.float_precision(operands))
    return y.astype(x.dtype)
  if not recipe.quantized:  # bf16 operands and f32 accumulation in all three GEMMs (see bf16.py)
    return bf16.bf16_matmul(x, w, tp_split, np.dtype(x.dtype), np.dtype(w.dtype))
  y_BxSxN = _qmatmul(recipe, tp_split, np.dtype(x.dtype), np.dtype(w.dtype), _as_examples(x), w, key)
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
# the upstream gradient and runs int8 GEMMs on the saved int8 operands. The static arguments:
# the recipe, the tensor-parallel split (or None) and the dtypes of x and w (those of dX and dW).


class _Residuals(NamedTuple):
  """What the forward saves for the backward: the forward's codes, their scales and the key."""

  xqT_KxT: jax.Array  # X̂ᵀ [K, T]: the activation codes (int8 or E4M3), transposed for dW = X̂ᵀ Q
  wq_KxN: jax.Array  # Ŵ [K, N]: the weight codes (int8 or E4M3)
  sx_BxS: jax.Array  # s_x, f32 [B, S]: the per-token activation scales
  sw_N: jax.Array  # s_w, f32 [N]: the per-output-channel weight scales
  key: jax.Array | None  # typed key of the backward's rounding; None for forward-only use


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _qmatmul(
  recipe: Recipe,
  tp: TensorParallel | None,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  x_BxSxK: jax.Array,
  w_KxN: jax.Array,
  key: jax.Array | None,
) -> jax.Array:
  return _fwd(recipe, tp, x_dtype, w_dtype, x_BxSxK, w_KxN, key)[0]


def _fwd(
  recipe: Recipe,
  tp: TensorParallel | None,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  x_BxSxK: jax.Array,
  w_KxN: jax.Array,
  key: jax.Array | None,
) -> tuple[jax.Array, _Residuals]:
  """(Y [B, S, N] in x's dtype, the residuals)."""
  del w_dtype
  batch, seq, k = x_BxSxK.shape
  fmt = formats.get_format(recipe.forward_format)  # int8, or E4M3 (an all-FP8 recipe)
  w_KxN = numerics.own_layout(w_KxN)  # on GPU: no transposed copy of a scanned weight stack
  sx_BxS = numerics.absmax_scale(x_BxSxK, axis=2, fmt=fmt)
  sw_N = numerics.absmax_scale(w_KxN, axis=0, fmt=fmt)
  xq_TxK = numerics.quantize_rtne(x_BxSxK, sx_BxS[:, :, None], fmt).reshape(batch * seq, k)
  wq_KxN = numerics.quantize_rtne(w_KxN, sw_N[None, :], fmt)

  if tp is not None and tp.kind == "row":  # each shard's partial product rescaled and rounded on its own
    rescale = lambda acc_TxN: acc_TxN * sx_BxS.reshape(-1, 1) * sw_N
    y_TxN = tensor_parallel.split_contraction(xq_TxK, wq_KxN, tp, b_transposed=False, rescale=rescale, dtype=x_dtype)
  else:
    acc_TxN = numerics.code_matmul(xq_TxK, wq_KxN).astype(jnp.float32)
    y_TxN = numerics.rescaled(acc_TxN, sx_BxS.reshape(-1, 1), sw_N, x_dtype)
  y_BxSxN = y_TxN.reshape(batch, seq, -1)
  # X̂ is saved transposed so that dW = X̂ᵀ Q contracts the tokens in the fast GEMM layout.
  xqT_KxT = numerics.materialized_transpose(xq_TxK, sx_BxS[0, 0])
  return y_BxSxN, _Residuals(xqT_KxT, wq_KxN, sx_BxS, sw_N, key)


# (dX [B, S, K] in x's dtype, dW [K, N] in w's dtype, no cotangent for the key)
_Cotangents = tuple[jax.Array, jax.Array, None]


def _bwd(
  recipe: Recipe, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype, res: _Residuals, g_BxSxN: jax.Array
) -> _Cotangents:
  if recipe.stochastic and res.key is None:
    raise ValueError(
      f"qmatmul: recipe {recipe.name!r} rounds the gradient stochastically and needs a key in the backward "
      "pass, but the forward ran with key=None. Pass key=jax.random.key(...) to s3r.qmatmul (a fresh "
      "one per layer and step); with s3r.nn's Linen adapters pass rngs={'quant': step_key} to apply() "
      "and, under nn.scan/nn.vmap, name 'quant' in split_rngs (a stream not named there does not reach "
      "the layers); NNX adapters draw from their own 'quant' stream. Forward-only use needs no key."
    )
  return _backward(recipe, tp, x_dtype, w_dtype, res, g_BxSxN)


_qmatmul.defvjp(_fwd, _bwd)


# The backward quantizes the upstream gradient (rounding, clipping, int8 casts): its JAX
# derivative exists but is not the derivative of anything meaningful, so differentiating it
# (grad of grad, jax.hessian, jvp of a gradient) raises instead of returning those numbers.
@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3))
def _backward(
  recipe: Recipe, tp: TensorParallel | None, x_dtype: np.dtype, w_dtype: np.dtype, res: _Residuals, g_BxSxN: jax.Array
) -> _Cotangents:
  if recipe.rounding == "exact":
    return _exact_bwd(x_dtype, w_dtype, res, g_BxSxN)
  batch, seq = res.sx_BxS.shape
  layout = _DenseLayout(recipe, tp, x_dtype, w_dtype, res, g_BxSxN)
  dx_TxK, dw_KxN = backward.quantized_backward(recipe, layout, res.key)
  return dx_TxK.reshape(batch, seq, -1), dw_KxN, None


class _DenseLayout(NamedTuple):
  """The dense layer's steps of `backward.quantized_backward` (G' [B, S, N], T = B*S rows)."""

  recipe: Recipe
  tp: TensorParallel | None
  x_dtype: np.dtype
  w_dtype: np.dtype
  res: _Residuals
  g_BxSxN: jax.Array

  def quantize(self, recipe: Recipe, key: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    return quantize_gradient(recipe, self.res.sx_BxS, self.res.sw_N, self.g_BxSxN, key)

  def error_factors(self, e_BxSxN: jax.Array) -> ec.Factors:
    return ec.error_factors(e_BxSxN)

  def dx(self, q_BxSxN: jax.Array, delta: jax.Array, factors: ec.Factors | None) -> jax.Array:
    """dX [T, K] in x's dtype."""
    n = self.res.wq_KxN.shape[1]
    scale_Tx1 = (delta / self.res.sx_BxS).reshape(-1, 1)
    return _dx(self.recipe, self.tp, self.x_dtype, q_BxSxN.reshape(-1, n), self.res.wq_KxN, scale_Tx1, factors)

  def dw(self, q_BxSxN: jax.Array, delta: jax.Array, factors: ec.Factors | None) -> jax.Array:
    """dW [K, N] in w's dtype: (Δ/s_w) (X̂ᵀ Q - the S3R-EC correction built from `factors`, if given)."""
    xqT_KxT, wq_KxN = self.res.xqT_KxT, self.res.wq_KxN
    fmt = formats.get_format(self.recipe.grad_format)
    acc_dw_KxN = numerics.code_matmul(xqT_KxT, q_BxSxN.reshape(-1, wq_KxN.shape[1]), fmt).astype(jnp.float32)
    if factors is not None:
      acc_dw_KxN = acc_dw_KxN - ec.dw_correction(*factors, xqT_KxT)
    return (acc_dw_KxN * (delta / self.res.sw_N)).astype(self.w_dtype)


@_backward.defjvp
def _backward_jvp(recipe, tp, x_dtype, w_dtype, primals, tangents):
  del tp, x_dtype, w_dtype, primals, tangents
  raise NotImplementedError(
    f"qmatmul: higher-order derivatives through recipe {recipe.name!r} are not defined: its backward pass "
    "quantizes the gradient and is not differentiable (grad of grad, jax.hessian and jvp of a gradient "
    "all differentiate it). Use recipe='bf16' for the part differentiated twice, or wrap it in "
    "jax.lax.stop_gradient."
  )


def _dx(
  recipe: Recipe,
  tp: TensorParallel | None,
  x_dtype: np.dtype,
  q_TxN: jax.Array,
  wq_KxN: jax.Array,
  scale_Tx1: jax.Array,
  factors: ec.Factors | None,
) -> jax.Array:
  """dX [T, K] in x's dtype: (Δ/s_x) (Q Ŵᵀ - the S3R-EC correction built from `factors`, if given).

  Under column tensor parallelism the GEMM's per-shard partial products are rounded and
  summed first, and the correction (built from small factors) is subtracted from that sum.
  """
  fmt = formats.get_format(recipe.grad_format)
  correction_TxK = None if factors is None else ec.dx_correction(*factors, wq_KxN, fmt).reshape(q_TxN.shape[0], -1)
  if tp is None or tp.kind != "column":
    acc_TxK = numerics.code_matmul_nt(q_TxN, wq_KxN, fmt).astype(jnp.float32)
    if correction_TxK is not None:
      acc_TxK = acc_TxK - correction_TxK
    return (acc_TxK * scale_Tx1).astype(x_dtype)
  dx_TxK = tensor_parallel.split_contraction(
    q_TxN, wq_KxN, tp, b_transposed=True, rescale=lambda acc: acc * scale_Tx1, dtype=x_dtype
  )
  if correction_TxK is None:
    return dx_TxK
  return (dx_TxK.astype(jnp.float32) - correction_TxK * scale_Tx1).astype(x_dtype)


@jax.named_scope("s3r_quantize")  # names its kernels in profiles and the performance model
def quantize_gradient(
  recipe: str | Recipe, sx_BxS: jax.Array, sw_N: jax.Array, g_BxSxN: jax.Array, key: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(Δ, G'/Δ, Q for dX, Q for dW): the backward's quantization of the upstream gradient.

  The code path of `qmatmul`'s backward (benchmarks and diagnostics call it directly):
  G' = s_x G s_w with the forward's activation scales `sx_BxS` and weight scales `sw_N`,
  one step Δ, then the recipe's rounding of G'/Δ into codes of its gradient format (one array
  returned twice unless the recipe splits). `key` is a typed key; stochastic recipes need it.
  """
  recipe = arguments.check_recipe("quantize_gradient", recipe)
  gp_BxSxN = sx_BxS[:, :, None] * g_BxSxN.astype(jnp.float32) * sw_N
  delta, v_BxSxN = scale_gradient(recipe, gp_BxSxN)
  q_dx, q_dw = round_gradient(recipe, v_BxSxN, key, _dense_draw(v_BxSxN.shape))
  return delta, v_BxSxN, q_dx, q_dw


def scale_gradient(recipe: Recipe, gp: jax.Array, axes: tuple[str, ...] = ()) -> tuple[jax.Array, jax.Array]:
  """(Δ, G'/Δ): the per-tensor step of the scaled gradient `gp` = G' in the recipe's gradient
  format (Δ = max|G'|/Q for a uniform grid, 127 for int8; max|G'|/(6 · 448) for nvfp4; 1 for
  mxfp4, which has block scales only) and G' in units of it.

  Under sharding Δ is the max over all shards (XLA inserts one scalar all-reduce), so it does
  not depend on the device mesh; `axes` names mesh axes to take that max over explicitly
  (inside `shard_map`).
  """
  amax = reductions.abs_max(gp)  # NaN when G' holds a NaN or an Inf: Δ too, so dX and dW are NaN
  delta = formats.get_format(recipe.grad_format).scale(jax.lax.pmax(amax, axes) if axes else amax)
  return delta, gp * numerics.reciprocal(delta)  # never a division: see numerics.quantize_rtne


def round_gradient(recipe: Recipe, v: jax.Array, key: jax.Array | None, draw: Draw) -> tuple[jax.Array, jax.Array]:
  """Codes (Q for dX, Q for dW) of v = G'/Δ in the recipe's gradient format: one array, returned
  twice, unless the recipe splits (then two, from the two halves of `key`).

  `draw(key, topology)` gives the thresholds of a `thresholds.Topology` broadcastable against v
  (the recipe's `threshold_topologies`). The key chain is the recipe's: none for RTNE, `key`
  itself for one shared Q, `jax.random.split(key)` for two.
  """
  fmt = formats.get_format(recipe.grad_format)
  if recipe.rounding == "rtne":
    q = fmt.round(v)
    return q, q
  if key is None:
    raise ValueError(f"recipe {recipe.name!r} rounds the gradient stochastically and needs a key, got None")
  topo_dx, topo_dw = recipe.threshold_topologies  # raises on an unknown topology
  if recipe.split:
    key_dx, key_dw = jax.random.split(key)
    with jax.named_scope("s3r_threshold"):
      r_dx, r_dw = draw(key_dx, topo_dx), draw(key_dw, topo_dw)
    return fmt.round(v, r_dx), fmt.round(v, r_dw)
  with jax.named_scope("s3r_threshold"):
    r = draw(key, topo_dx)
  q = fmt.round(v, r)
  return q, q


def _dense_draw(shape_BxSxN: tuple[int, ...]) -> Draw:
  """`round_gradient`'s draws for G' [B, S, N]: each topology's dense draws."""
  batch, seq, n = shape_BxSxN
  return lambda key, topology: topology.dense(key, (batch, seq, n))


def gradient_codes(
  x: jax.Array, w: jax.Array, g: jax.Array, *, key: jax.Array | None = None, recipe: str | Recipe = "s3r"
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(Q for dX, Q for dW, Δ): the codes (of the recipe's gradient format) and step that the
  backward of `qmatmul(x, w)` makes of the upstream gradient `g` ([..., N], the shape of the
  output). Same code path as the backward pass (for tests and diagnostics); one Q returned
  twice unless the recipe splits.
  """
  recipe, key = arguments.check("qmatmul", recipe, key, x, w, key_required=True)
  if not recipe.quantized_gradient:
    raise ValueError(f"gradient_codes: recipe {recipe.name!r} does not quantize the gradient")
  fwd = formats.get_format(recipe.forward_format)
  sx_BxS = numerics.absmax_scale(_as_examples(x), axis=2, fmt=fwd)
  sw_N = numerics.absmax_scale(w, axis=0, fmt=fwd)
  delta, _, q_dx, q_dw = quantize_gradient(recipe, sx_BxS, sw_N, _as_examples(g), key)
  shape = x.shape[:-1] + (w.shape[1],)
  return q_dx.reshape(shape), q_dw.reshape(shape), delta


def _exact_bwd(x_dtype: np.dtype, w_dtype: np.dtype, res: _Residuals, g_BxSxN: jax.Array) -> _Cotangents:
  """G Ŵ_deqᵀ and X̂_deqᵀ G in f32: the exact gradient of the executed INT8 forward graph."""
  xqT_KxT, wq_KxN, sx_BxS, sw_N, _ = res
  g_TxN = g_BxSxN.astype(jnp.float32).reshape(-1, wq_KxN.shape[1])
  hi = jax.lax.Precision.HIGHEST
  deq = formats.FORWARD_FORMAT.dequantize
  dx_TxK = jnp.matmul(g_TxN, deq(wq_KxN, sw_N).T, precision=hi)
  dw_KxN = jnp.matmul(deq(xqT_KxT, sx_BxS.reshape(1, -1)), g_TxN, precision=hi)
  return dx_TxK.reshape(g_BxSxN.shape[:2] + (-1,)).astype(x_dtype), dw_KxN.astype(w_dtype), None
