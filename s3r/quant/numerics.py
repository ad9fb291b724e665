"""Forward numerics and GEMMs on codes: absmax scales, round-to-nearest-even codes, the code GEMMs.

The forward's codes are `formats.FORWARD_FORMAT` (int8 in [-127, 127]) unless a recipe names another
forward format (E4M3, `Recipe.forward_format`); the grid, dtypes, step and clipping of every format
live in formats/.

Dimension letters: T tokens (B*S flattened), K input features, N output features.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike

from s3r.quant.formats import FORWARD_FORMAT, Format
from s3r.quant.reductions import abs_max

QMAX = FORWARD_FORMAT.qmax  # the forward's largest code (127: the int8 range made symmetric)
INV_QMAX = FORWARD_FORMAT.inv_qmax  # f32 reciprocal of QMAX


@jax.named_scope("s3r_quantize")  # names its kernels in profiles and the performance model
def absmax_scale(x: jax.Array, axis: int, fmt: Format = FORWARD_FORMAT) -> jax.Array:
  """s = max |x| / 127 along `axis` (f32): the forward format's scale (max |x| / 448 for E4M3 `fmt`);
  an all-zero slice gets 1.

  Computed as max|x| * f32(1/127) (`Format.scale`). A slice whose max is below 127 times the
  smallest normal f32 (~1.5e-36) gets a subnormal scale, which XLA:CPU flushes to zero, so it
  takes the zero-slice path and quantizes to all-zero codes. A slice holding a NaN or an Inf gets
  the scale NaN (`reductions.abs_max`): its codes are 0 and every product rescaled by it NaN.
  """
  return fmt.scale(abs_max(x, axis=axis))


@jax.named_scope("s3r_quantize")  # names its kernels in profiles and the performance model
def quantize_rtne(x: jax.Array, scale: jax.Array, fmt: Format = FORWARD_FORMAT) -> jax.Array:
  """int8 codes RTNE(x * (1/scale)), clipped to [-127, 127] (codes of `fmt`, rounded to nearest, for
  another format); `scale` broadcasts against x.

  Multiplies by the f32 reciprocal of the scale, never divides: XLA rewrites a division by a
  broadcast scale into that multiplication in some fusions and not in others, and the two
  differ by an ulp. bf16 inputs hit exact ties often (x = max/2 gives 63.5 with the
  reciprocal but 63.499996 with the division), so a division let the forward GEMM and the
  saved X̂ᵀ of the same program, or two device meshes, round a tie differently.
  """
  return fmt.round(x.astype(jnp.float32) * reciprocal(scale))


def reciprocal(a: jax.Array) -> jax.Array:
  """1/a in f32, computed once per scale (see quantize_rtne)."""
  return jnp.float32(1) / a.astype(jnp.float32)


def code_matmul(a_MxC: jax.Array, b_CxN: jax.Array, fmt: Format = FORWARD_FORMAT) -> jax.Array:
  """Product of two code tensors by `fmt`'s GEMM (`formats.code_dot_general`, chosen by the operand
  dtypes: int8 x int8 -> int32; FP8 x FP8 -> f32, native on Hopper; an exact f32 emulation for any
  other pair) in the canonical layout (contract a's last, b's first dim).

  XLA:CPU runs this layout several times faster than one that contracts a leading
  dimension, so every caller passes operands already laid out this way.
  """
  return fmt.dot_general(a_MxC, b_CxN, (((1,), (0,)), ((), ())))


def code_matmul_nt(a_MxC: jax.Array, b_NxC: jax.Array, fmt: Format = FORWARD_FORMAT) -> jax.Array:
  """Product a @ b.T of two code tensors by `fmt`'s GEMM, as `code_matmul` (contracts the last dim of
  both; also a fast layout)."""
  return fmt.dot_general(a_MxC, b_NxC, (((1,), (1,)), ((), ())))


def materialized_transpose(a_MxN: jax.Array, nonnegative: jax.Array) -> jax.Array:
  """a.T as a real row-major copy that XLA:CPU cannot fold back into the consuming dot.

  XLA's simplifier sinks a plain transpose into the dot_general that consumes it, turning
  X̂ᵀ Q into a dot that contracts X̂'s leading (token) dimension; XLA:CPU then upcasts the
  int8 operands to int32 and runs a generic GEMM about 15x slower. On CPU, a conditional on
  a runtime value (`nonnegative`, any scalar >= 0 or NaN, e.g. a scale) is opaque to that
  rewrite (`optimization_barrier` is not: XLA:CPU expands it early). Both branches have the
  same shape; the second is never taken. Other backends get the plain transpose (their
  GEMMs take either layout, and a conditional would cost a device-to-host sync on GPU).
  """

  def cpu(a):
    take = jnp.logical_not(nonnegative < 0)  # true for every scale, NaN included
    return lax.cond(take, lambda a: a.T, lambda a: jnp.zeros_like(a.T), a)

  return lax.platform_dependent(a_MxN, cpu=cpu, default=lambda a: a.T)


def own_layout(w: jax.Array) -> jax.Array:
  """w with its row-major layout pinned on GPU (an identity on the values; other backends get w).

  XLA:GPU runs an int8 GEMM with both operands' contracting dimension minor-most, so the forward
  GEMM X̂ Ŵ wants Ŵ [K, N] laid out K-minor, and layout assignment carries that layout back
  through the quantizer to the weight itself. In a scanned decoder the weight is a slice of the
  stacked layer weights, so the loop's state takes the transposed layout, and XLA transposes
  every stacked f32 weight once before the loop and keeps the copies for the whole step (the
  Llama 3.1-8B step at 32 layers, compiled for an H100: 19 GiB more temporaries than bf16;
  docs/performance-gpu.md). With the weight's own layout pinned where the layer reads it, XLA gives
  the int8 codes the GEMM's layout inside the loop, layer by layer. bf16 GEMMs take either
  layout and need none of this.
  """
  from jax.experimental.layout import Layout, with_layout_constraint

  pin = lambda a: with_layout_constraint(a, Layout(major_to_minor=tuple(range(a.ndim))))
  return lax.platform_dependent(w, cuda=pin, rocm=pin, default=lambda a: a)


def rescaled(acc_TxN: jax.Array, sx_Tx1: jax.Array, sw_N: jax.Array, dtype: DTypeLike) -> jax.Array:
  """dtype(acc · s_x · s_w): the forward GEMM's f32 product rescaled by the per-token scales [T, 1]
  and the per-output-channel scales [N], in this order on every backend.

  On GPU the rescale reads its operands through an optimization barrier and its result passes
  through another. XLA's Triton GEMM fusion takes a rescale into the GEMM's epilogue only when the
  scales are parameters of the computation, which scales computed in the program are not, so the
  GEMM writes the f32 product [T, N]. Without the barriers XLA merges the rescales of two
  projections of one input (an FFN's gate and up) into one fusion, which keeps both f32 products
  live together, and recomputes the output from the f32 product inside the backward pass's
  fusions, which keeps an f32 product live until then. With them the output is written once and
  each f32 product dies at its rescale. The barriers are identities around the same multiplies
  and cast in the same order, so the values are the same bit for bit; only fusion boundaries move
  (docs/performance-gpu.md has the memory). Other backends get the plain expression.
  """

  def plain(acc_TxN, sx_Tx1, sw_N):
    return (acc_TxN * sx_Tx1 * sw_N).astype(dtype)

  def fenced(acc_TxN, sx_Tx1, sw_N):
    return lax.optimization_barrier(plain(*lax.optimization_barrier((acc_TxN, sx_Tx1, sw_N))))

  return lax.platform_dependent(acc_TxN, sx_Tx1, sw_N, cuda=fenced, rocm=fenced, default=plain)
