"""The grouped (mixture-of-experts) quantized matmul: `qmatmul` for expert-sorted rows.

`grouped_qmatmul(x, w, group_sizes)` has the semantics of `jax.lax.ragged_dot`: rows of x
are sorted by expert, expert e owns `group_sizes[e]` consecutive rows and multiplies them
by w[e]; rows past `sum(group_sizes)` give zero outputs and zero gradients.

It mirrors the dense layer (quant/matmul.py), and runs the same backward sequence
(`backward.quantized_backward`) on its own layout (`_GroupedLayout`). Forward: per-row activation scales,
per-(expert, output column) weight scales, RTNE codes of the recipe's forward format, one grouped GEMM
on codes, rescale: int8 x int8 -> int32 by default; E4M3 x E4M3 -> f32 for an all-FP8 recipe
(`NAME+fwd_e4m3`: the dense layer's scales onto 448 and E4M3 codes, `Recipe.forward_format`).
Backward: G' = s_x G s_w (each row with its expert's s_w), one per-tensor step Δ, Q
quantized once for both products (twice for split recipes) into codes of the recipe's gradient
format (a uniform grid: int8, int6 or int4, or FP8: e4m3, e5m2; the block-scaled FP4 formats are
refused) by the dense quantizer's own functions (`matmul.scale_gradient`, `matmul.round_gradient`), as
`quantize_gradient` quantizes the [T, N] rows as one example of T tokens; dX = (Δ/s_x) Q Ŵ_eᵀ
and dW[e] = (Δ/s_w[e]) X̂_eᵀ Q_e are two more grouped GEMMs on codes, Ŵ and X̂ the forward's codes (as in
the dense layer). Which GEMM each pair of codes gets is `formats.code_dot_general`'s rule: int8 x int8 in
int32 (the Pallas kernels take these); FP8 x FP8 on the FP8 operands with f32 results (an FP8 GEMM when
compiled for Hopper, an f32 emulation on XLA:CPU); a mixed pair (int8 with FP8 codes) an exact f32
emulation. Of these only int8 x int8 runs in the Pallas kernels: the others take the tiled or ragged
GEMMs (gemm.py), under impl="auto" and "pallas" too. The unquantized `bf16` recipe's three
GEMMs (bf16 x bf16 -> f32) run in the Pallas kernels like the int8 ones (its full-precision f32
variant, `compute_dtype=float32`, on the tiled and ragged GEMMs). Shared thresholds are one
per row for `s3r` (a row is one token's copy for one expert), one per expert segment for the
`_bcast` recipes (the segment plays the dense example's role), and S3R-EC projects the error per
segment (grouped/ec.py).

Sharded rows (expert parallelism, s3r.model.moe_ep): when the rows are one shard's part of a
larger grouped product, `rows=GlobalRows(...)` says where each sits in the global row order;
the backward then draws every threshold by the global row (or expert) index and takes Δ as the
max over the mesh axes holding the other rows, so each row is quantized exactly as in the
unsharded product.

Dimension letters: T rows, E experts, K input features, N outputs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import arguments, backward, ec, explicit, formats, matmul, numerics, thresholds
from s3r.quant.grouped import ec as grouped_ec
from s3r.quant.grouped import gemm as grouped_gemm
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe

_NAME = "grouped_qmatmul"
# impl=None: "auto", the compiled Pallas kernels on CUDA (the int8 ones verified bit for bit against
# ragged_dot on an H200, where the tiled dW GEMM was not) and the tiled path elsewhere; a
# platform_dependent choice, so a CPU program holds only the tiled path. The kernels take the int8
# codes and the bf16 recipe's bf16 operands; other float GEMMs: tiled forward and dX, dW ragged on CUDA.
DEFAULT_IMPL = "auto"


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=["index", "expert0"], meta_fields=["total", "experts", "axes"]
)
@dataclasses.dataclass(frozen=True, kw_only=True)
class GlobalRows:
  """Where one shard's rows sit in a grouped product spread over mesh axes (inside `shard_map`).

  A pytree: the arrays (index, expert0) are its leaves, the sizes and axes its static part, so
  it passes through the custom VJP (and jit) as one argument.
  """

  index: jax.Array  # int32 [T]: each row's position in the global expert-sorted rows (padding rows: any)
  expert0: jax.Array  # int32 []: the global index of w[0], the shard's first expert
  total: int  # rows of the global product: per-row thresholds are drawn for this many rows
  experts: int  # experts of the global product: per-expert thresholds ("_bcast") are drawn for this many
  axes: tuple[str, ...]  # mesh axes over which the global rows are spread: Δ is the max over them


def _normalized(rows: GlobalRows) -> GlobalRows:
  """`rows` with int32 arrays and plain Python static fields."""
  return GlobalRows(
    index=rows.index.astype(jnp.int32),
    expert0=jnp.asarray(rows.expert0, jnp.int32),
    total=int(rows.total),
    experts=int(rows.experts),
    axes=tuple(rows.axes),
  )


def grouped_qmatmul(
  x: jax.Array,
  w: jax.Array,
  group_sizes: jax.Array,
  *,
  key: jax.Array | None = None,
  recipe: str | Recipe = DEFAULT_RECIPE,
  impl: str | None = None,
  rows: GlobalRows | None = None,
  compute_dtype=None,
) -> jax.Array:
  """The ragged product out[t] = x[t] @ w[e(t)] with the recipe's quantized (INT8 or E4M3) forward and backward.

  Args:
    x: activations [T, K], rows sorted by expert.
    w: expert weights [E, K, N] (typically f32 master weights).
    group_sizes: int32 [E], rows per expert, sum ≤ T. Concrete values are checked (no
      negative size, sum ≤ T); traced values cannot be: there a negative size counts as 0 and
      segments are cut at row T (all implementations agree on that).
    key: a `jax.random.key` for the backward's rounding; required by stochastic recipes.
    recipe: a `Recipe` or a registered name (see `s3r.RECIPES`), with the dense meaning.
    impl: the grouped GEMM: "auto" (the default, None: the compiled Pallas kernels on GPU,
      "tiled" elsewhere), "tiled" (tile-padded batched int8 GEMMs, at most T + E·tile rows of
      work), "ragged" (`jax.lax.ragged_dot`, the exact reference; XLA expands it to E times the
      work) or "pallas" (the Pallas kernels with the dequantize epilogue fused: compiled on GPU,
      interpret mode elsewhere, which is for tests). All give bit-identical results on the CPU
      for the int8 forward; on a GPU the tiled dW GEMM is not verified (see grouped_gemm), so "auto"
      runs none there. The kernels take int8 codes and the `bf16` recipe's bf16 operands (f32
      accumulation: equal to the other paths up to the order of f32 sums): with the E4M3 forward,
      FP8 gradient codes or f32 operands "auto" and "pallas" run the forward and dX on the tiled
      path and dW on the ragged path on CUDA (the tiled one elsewhere).
    rows: None (the rows are the whole product), or, inside `shard_map`, where the rows sit in
      the global product (`GlobalRows`): the backward then quantizes each row as the global
      product does (thresholds by global row or expert index, Δ a max over `rows.axes`).
    compute_dtype: the operand dtype of the unquantized recipe (`bf16`), as in `qmatmul`: None or
      bfloat16, or float32 (full precision). The INT8 recipes ignore it.

  Returns [T, N] in x's dtype; rows past sum(group_sizes) are zero.
  """
  recipe, key = arguments.check(_NAME, recipe, key, x, w, group_sizes, key_required=True)
  operands = arguments.compute_dtype(_NAME, compute_dtype)
  impl = _check_impl(impl)
  if explicit.explicit_axes():  # sharding in types: the internals run with Auto axes (see explicit.py)
    body = functools.partial(grouped_qmatmul, recipe=recipe, impl=impl, rows=rows, compute_dtype=compute_dtype)
    out = explicit.matmul_spec(x, w)
    return explicit.run_auto(lambda x, w, g, key: body(x, w, g, key=key), out, x, w, group_sizes, key)
  if recipe.quantized_gradient and not formats.get_format(recipe.grad_format).capabilities.grouped:
    raise ValueError(
      f"{_NAME}: gradient format {recipe.grad_format!r} (recipe {recipe.name!r}) is not supported on the grouped "
      f"(expert) path: its grouped GEMMs take integer or FP8 codes only (the Pallas kernels integer ones); use one of "
      f"{', '.join(formats.formats_with('grouped'))}"
    )
  if not recipe.quantized:
    return _float_gmm(impl, operands, x, w, group_sizes).astype(x.dtype)
  rows = None if rows is None else _normalized(rows)
  return _gqmatmul(recipe, impl, np.dtype(x.dtype), np.dtype(w.dtype), x, w, group_sizes, key, rows)


# --- the unquantized (bf16) product: _float_gmm, _fwd, _bwd, defvjp --------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _float_gmm(impl: str, dt: np.dtype, x_TxK: jax.Array, w_ExKxN: jax.Array, group_sizes: jax.Array) -> jax.Array:
  """[T, N] f32: operands in `dt` (bf16, or f32 at full precision), f32 accumulation. The VJP is two
  more grouped GEMMs in `dt` with f32 accumulation, dX = G W_eᵀ in x's dtype and dW[e] = X_eᵀ G_e in
  w's, as the dense product's (bf16.py; G enters in `dt`: lossless for activations in `dt`, whose
  output gradient is in `dt`), so no gathered weight copy or f32 weight copy is kept or differentiated."""
  lay = grouped_gemm.layout(group_sizes, x_TxK.shape[0])
  precision = arguments.float_precision(dt)
  return grouped_gemm.gmm(x_TxK.astype(dt), w_ExKxN.astype(dt), lay, impl, out=jnp.float32, precision=precision)


def _float_fwd(
  impl: str, dt: np.dtype, x_TxK: jax.Array, w_ExKxN: jax.Array, group_sizes: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  return _float_gmm(impl, dt, x_TxK, w_ExKxN, group_sizes), (x_TxK, w_ExKxN, group_sizes)


def _float_bwd(
  impl: str, dt: np.dtype, res: tuple[jax.Array, jax.Array, jax.Array], g_TxN: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
  x_TxK, w_ExKxN, group_sizes = res
  lay = grouped_gemm.layout(group_sizes, x_TxK.shape[0])
  g_TxN = jnp.where(_valid(lay)[:, None], g_TxN, 0.0).astype(dt)  # a NaN padding row stays out of dW
  xb_TxK, wb_ExKxN = x_TxK.astype(dt), w_ExKxN.astype(dt)
  precision = arguments.float_precision(dt)
  dx_TxK = grouped_gemm.gmm_nt(g_TxN, wb_ExKxN, lay, impl, out=jnp.float32, precision=precision)
  dw_ExKxN = grouped_gemm.tgmm(xb_TxK, g_TxN, lay, impl, out=jnp.float32, precision=precision)
  return dx_TxK.astype(x_TxK.dtype), dw_ExKxN.astype(w_ExKxN.dtype), None


_float_gmm.defvjp(_float_fwd, _float_bwd)


# --- custom VJP: _gqmatmul, _fwd, _bwd, defvjp -----------------------------------------------
# Static arguments: the recipe, the grouped GEMM's impl and the dtypes of x and w (those of dX and
# dW). `rows` (GlobalRows or None) is a pytree argument: its arrays get no cotangent, its static
# fields travel in its tree structure.


class _Residuals(NamedTuple):
  """What the forward saves for the backward: the forward's codes, their scales, the rows and the key."""

  xq_TxK: jax.Array  # X̂ [T, K]: the activation codes (int8 or E4M3)
  wq_ExKxN: jax.Array  # Ŵ [E, K, N]: the weight codes (int8 or E4M3)
  sx_T: jax.Array  # s_x, f32 [T]: the per-row activation scales
  sw_ExN: jax.Array  # s_w, f32 [E, N]: the per-(expert, output column) weight scales
  group_sizes: jax.Array  # int32 [E], sanitized (grouped_gemm.sanitize)
  key: jax.Array | None  # typed key of the backward's rounding
  rows: GlobalRows | None  # where the rows sit in a sharded product, or None


# (dX [T, K] in x's dtype, dW [E, K, N] in w's dtype, no cotangents for group_sizes, key and rows)
_Cotangents = tuple[jax.Array, jax.Array, None, None, None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _gqmatmul(
  recipe: Recipe,
  impl: str,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  x_TxK: jax.Array,
  w_ExKxN: jax.Array,
  group_sizes: jax.Array,
  key: jax.Array | None,
  rows: GlobalRows | None,
) -> jax.Array:
  return _fwd(recipe, impl, x_dtype, w_dtype, x_TxK, w_ExKxN, group_sizes, key, rows)[0]


def _fwd(
  recipe: Recipe,
  impl: str,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  x_TxK: jax.Array,
  w_ExKxN: jax.Array,
  group_sizes: jax.Array,
  key: jax.Array | None,
  rows: GlobalRows | None,
) -> tuple[jax.Array, _Residuals]:
  """(Y [T, N] in x's dtype, the residuals)."""
  del w_dtype
  lay = grouped_gemm.layout(group_sizes, x_TxK.shape[0])
  fmt = formats.get_format(recipe.forward_format)  # int8, or E4M3 (an all-FP8 recipe): the dense layer's rule
  sx_T = numerics.absmax_scale(x_TxK, axis=1, fmt=fmt)
  sw_ExN = numerics.absmax_scale(w_ExKxN, axis=1, fmt=fmt)
  xq_TxK = numerics.quantize_rtne(x_TxK, sx_T[:, None], fmt)
  wq_ExKxN = numerics.quantize_rtne(w_ExKxN, sw_ExN[:, None, :], fmt)
  # acc · s_x[t] · s_w[e(t)], padding rows explicitly 0 (a NaN padding row stays 0): the GEMM's epilogue
  y_TxN = grouped_gemm.gmm_epilogue(xq_TxK, wq_ExKxN, lay, impl, row_T=sx_T, col_ExN=sw_ExN, out=x_dtype)
  return y_TxN, _Residuals(xq_TxK, wq_ExKxN, sx_T, sw_ExN, lay.group_sizes, key, rows)


def _bwd(
  recipe: Recipe,
  impl: str,
  x_dtype: np.dtype,
  w_dtype: np.dtype,
  res: _Residuals,
  g_TxN: jax.Array,
) -> _Cotangents:
  xq_TxK, _, sx_T, sw_ExN, group_sizes, key, _ = res
  lay = grouped_gemm.layout(group_sizes, xq_TxK.shape[0])
  valid_Tx1 = _valid(lay)[:, None]
  gp_TxN = jnp.where(valid_Tx1, sx_T[:, None] * g_TxN.astype(jnp.float32) * _row_scales(sw_ExN, lay), 0.0)
  if recipe.rounding == "exact":
    return _exact_bwd(impl, x_dtype, w_dtype, res, lay, jnp.where(valid_Tx1, g_TxN.astype(jnp.float32), 0.0))
  layout = _GroupedLayout(impl, x_dtype, w_dtype, res, lay, gp_TxN, recipe.grad_format)
  dx_TxK, dw_ExKxN = backward.quantized_backward(recipe, layout, key)
  return dx_TxK, dw_ExKxN, None, None, None


class _GroupedLayout(NamedTuple):
  """The grouped layer's steps of `backward.quantized_backward` (G' [T, N] of expert-sorted rows;
  S3R-EC's "example" is one expert's segment, grouped/ec.py)."""

  impl: str
  x_dtype: np.dtype
  w_dtype: np.dtype
  res: _Residuals
  lay: grouped_gemm.Layout
  gp_TxN: jax.Array  # G' (padding rows 0)
  grad_format: str  # the recipe's gradient format (formats.FORMATS)

  def quantize(self, recipe: Recipe, key: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    n_seg = self.lay.group_sizes.shape[0]
    return quantize_grouped_gradient(recipe, self.gp_TxN, self.lay.seg_T, n_seg, key, self.res.rows)

  def error_factors(self, e_TxN: jax.Array) -> ec.Factors:
    return grouped_ec.segment_factors(e_TxN, self.lay.seg_T, self.lay.group_sizes)

  def dx(self, q_TxN: jax.Array, delta: jax.Array, factors: ec.Factors | None) -> jax.Array:
    """dX [T, K] = (acc - corr) · Δ/s_x[t] in the GEMM's epilogue (padding rows 0)."""
    wq_ExKxN = self.res.wq_ExKxN
    fmt = formats.get_format(self.grad_format)
    corr_TxK = None if factors is None else grouped_ec.dx_correction(*factors, wq_ExKxN, self.lay.seg_T, fmt)
    row_T = delta / self.res.sx_T
    return grouped_gemm.gmm_nt_epilogue(
      q_TxN, wq_ExKxN, self.lay, self.impl, sub_TxK=corr_TxK, row_T=row_T, out=self.x_dtype
    )

  def dw(self, q_TxN: jax.Array, delta: jax.Array, factors: ec.Factors | None) -> jax.Array:
    """dW [E, K, N]: dW[e] = (acc - corr) · Δ/s_w[e] in the GEMM's epilogue."""
    xq_TxK = self.res.xq_TxK
    corr_ExKxN = None if factors is None else grouped_ec.dw_correction(*factors, xq_TxK, self.lay.seg_T)
    col_ExN = delta / self.res.sw_ExN
    return grouped_gemm.tgmm_epilogue(
      xq_TxK, q_TxN, self.lay, self.impl, sub_ExKxN=corr_ExKxN, col_ExN=col_ExN, out=self.w_dtype
    )


_gqmatmul.defvjp(_fwd, _bwd)


def _valid(lay: grouped_gemm.Layout) -> jax.Array:
  return lay.seg_T < lay.group_sizes.shape[0]


def _row_scales(sw_ExN: jax.Array, lay: grouped_gemm.Layout) -> jax.Array:
  """Each row's expert's weight scales, [T, N] (padding rows use the last expert's; masked later)."""
  return sw_ExN[jnp.minimum(lay.seg_T, sw_ExN.shape[0] - 1)]


@jax.named_scope("s3r_quantize")  # names its kernels in profiles and the performance model
def quantize_grouped_gradient(
  recipe: Recipe,
  gp_TxN: jax.Array,
  seg_T: jax.Array,
  n_seg: int,
  key: jax.Array | None,
  rows: GlobalRows | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(Δ, G'/Δ, Q for dX, Q for dW) of the scaled gradient G' [T, N] of expert-sorted rows.

  The dense quantizer's step, rounding and key chain (`matmul.scale_gradient` and
  `matmul.round_gradient`), with draws that match `quantize_gradient` on the rows as one
  example of T tokens, bit for bit: per element (`int8_sr`, [1, T, N] uniforms per product)
  or one threshold per row from ⌈T/4⌉ words. A per-example ("_bcast") topology becomes one
  threshold per expert segment, u[e(t)], from ⌈E/4⌉ words; rows past the segments have
  v = 0, whose code is 0 for any u.

  Sharded rows (`rows`, a GlobalRows): the draws are made for the whole product (`rows.total`
  rows, `rows.experts` segments) and gathered at each row's global index, and Δ is the max over
  `rows.axes`, so every row gets the code the unsharded product gives it.
  """
  t, n = gp_TxN.shape
  if rows is None:
    total, experts, axes, seg0 = t, n_seg, (), 0
    at_row = lambda u: u  # noqa: E731
  else:
    total, experts, axes, seg0 = rows.total, rows.experts, rows.axes, rows.expert0
    at_row = lambda u: u[jnp.clip(rows.index, 0, total - 1)]  # noqa: E731
  delta, v_TxN = matmul.scale_gradient(recipe, gp_TxN, axes)

  placed = thresholds.GroupedRows(
    total=total, experts=experts, channels=n, at_row=at_row, expert_T=seg0 + jnp.minimum(seg_T, n_seg - 1)
  )
  draw = lambda k, topology: topology.grouped(k, placed)  # noqa: E731
  q_dx, q_dw = matmul.round_gradient(recipe, v_TxN, key, draw)
  return delta, v_TxN, q_dx, q_dw


def _exact_bwd(
  impl: str, x_dtype: np.dtype, w_dtype: np.dtype, res: _Residuals, lay: grouped_gemm.Layout, g_TxN: jax.Array
) -> _Cotangents:
  """G Ŵ_deq,eᵀ and X̂_deq,eᵀ G_e in f32: the exact gradient of the executed forward graph
  (int8 or E4M3 codes)."""
  xq_TxK, wq_ExKxN, sx_T, sw_ExN, _, _, _ = res
  hi = jax.lax.Precision.HIGHEST
  w_deq = formats.FORWARD_FORMAT.dequantize(wq_ExKxN, sw_ExN[:, None, :])
  x_deq = formats.FORWARD_FORMAT.dequantize(xq_TxK, sx_T[:, None])
  dx_TxK = grouped_gemm.gmm_nt(g_TxN, w_deq, lay, impl, out=jnp.float32, precision=hi)
  dw_ExKxN = grouped_gemm.tgmm(x_deq, g_TxN, lay, impl, out=jnp.float32, precision=hi)
  return dx_TxK.astype(x_dtype), dw_ExKxN.astype(w_dtype), None, None, None


# --- the impl argument (the other checks: arguments.py) ---------------------------------------


def _check_impl(impl: str | None) -> str:
  if impl is None:
    return DEFAULT_IMPL
  if not isinstance(impl, str) or impl not in grouped_gemm.IMPLS:
    raise ValueError(f"{_NAME}: impl must be one of {grouped_gemm.IMPLS} or None (= {DEFAULT_IMPL!r}), got {impl!r}")
  return impl
