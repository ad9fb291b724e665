"""The FFN block compiled for the TPU v5p target on the CPU (`python -m benchmarks aot --target v5p`, libtpu's
compile-only devices): the structure that tests/quant/test_structure.py checks in the jaxpr and in XLA:CPU's
program, read here in XLA:TPU's optimized HLO. Slow, and skipped with the reason where libtpu (the optional
extra `tpu-aot`) is not installed.

What the TPU HLO lets one read: every GEMM is a `convolution` (inside an output fusion) with its operand and
result types and shapes; every conversion to int8 is a `convert` to s8 whose metadata names the JAX operation
it came from (`transpose(jvp())`: the backward); the entry computation's arrays are what XLA writes to memory.
The block here returns its output too (the benchmark's program returns only the gradients, so XLA drops the
down projection's forward GEMM there), so each projection has its three GEMMs."""

from __future__ import annotations

import functools

import pytest

import s3r
from benchmarks import aot, aot_programs, ffn
from labtools.analysis import hlo

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(
    not aot.tpu_plugin_installed(),
    reason="libtpu is not installed (pip install -e '.[tpu-aot]' -c constraints.txt, in an environment of its own)",
  ),
]

T, H, F = 512, 256, 768  # distinct sizes: T*H, T*F and H*F never coincide
RECIPES = ["int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx"]


@functools.cache
def _program(recipe: str) -> str:
  """Optimized TPU HLO of the FFN block's forward (output kept) and backward, for one v5p chip."""
  import jax
  import jax.numpy as jnp

  aot.use_cpu_host()
  mesh = aot.target_mesh(aot.target_devices("v5p"))
  array, key = aot_programs._abstract(mesh)  # abstract arguments on the target, as the aot benchmark makes them
  block = ffn.make_ffn(recipe)

  def fwd_bwd(x, wg, wu, wd, dy, key):
    y, vjp = jax.vjp(lambda x, wg, wu, wd: block(x, wg, wu, wd, key), x, wg, wu, wd)
    return y, vjp(dy)

  args = (
    array((T, H), jnp.bfloat16),
    array((H, F), jnp.float32),
    array((H, F), jnp.float32),
    array((F, H), jnp.float32),
    array((T, H), jnp.bfloat16),
    key,
  )
  return hlo.hlo_text(jax.jit(fwd_bwd).lower(*args).compile())


def _gemms(text: str) -> list[tuple[str | None, tuple[int, ...], list[tuple[str | None, tuple[int, ...]]]]]:
  """(result type, result dims, [(operand type, dims)]) of every convolution or dot in the module."""
  out = []
  for comp in hlo.parse_hlo(text).values():
    by_name = {i.name: i for i in comp.instrs}
    for ins in comp.instrs:
      if ins.opcode in ("convolution", "dot"):
        operands = [by_name[o] for o in ins.operands[:2]]
        out.append((ins.dtype, ins.dims, [(o.dtype, o.dims) for o in operands]))
  return out


def _int8_conversions(text: str, elements: int, backward: bool) -> int:
  """Conversions to int8 of an array of `elements` elements, in the backward (JAX's transpose) or the forward."""
  found = 0
  for comp in hlo.parse_hlo(text).values():
    for ins in comp.instrs:
      if ins.opcode == "convert" and ins.dtype == "s8" and ins.elements == elements:
        found += ("transpose(" in ins.op_name) == backward
  return found


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_projection_has_three_int8_gemms_with_int32_results_on_the_v5p(recipe):
  gemms = _gemms(_program(recipe))
  int8 = [g for g in gemms if [t for t, _ in g[2]] == ["s8", "s8"]]
  assert len(int8) == len(gemms), gemms  # every GEMM of the block takes int8 codes...
  assert all(g[0] == "s32" for g in int8), int8  # ...and accumulates in int32
  with_tokens = [g for g in int8 if any(T in dims for _, dims in g[2])]
  assert len(with_tokens) == 9  # forward, dX and dW of gate, up and down
  # S3R-EC's dX correction: one small product of the error's channel-mean digits (3 rows per example, and a
  # row of ones) with the weight codes per projection; nothing else without a token dimension
  small = [g for g in int8 if g not in with_tokens]
  assert len(small) == (3 if s3r.recipe(recipe).correct_dx else 0), small
  assert all(g[1][0] == 3 + 1 for g in small), small


def test_the_bf16_block_has_nine_bf16_gemms_and_no_int8_one_on_the_v5p():
  gemms = _gemms(_program("bf16"))
  assert len(gemms) == 9 and all([t for t, _ in g[2]] == ["bf16", "bf16"] for g in gemms), gemms


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_upstream_gradient_is_quantized_once_per_projection_on_the_v5p_except_for_split_recipes(recipe):
  # G of the down projection is [T, H], of gate and up [T, F]; a split recipe (independent SR for dX and
  # dW) quantizes each twice, which shows the count can fail
  text = _program(recipe)
  per_g = 2 if s3r.recipe(recipe).split else 1
  assert _int8_conversions(text, T * H, backward=True) == per_g
  assert _int8_conversions(text, T * F, backward=True) == 2 * per_g


def test_s3r_ec_quantizes_the_forward_activations_a_second_time_on_the_v5p():
  # What the TPU program does differently from S3R-EC with dX correction only: XLA recomputes the codes of
  # X and H (RTNE, the same codes) for the dW correction instead of keeping them (one transposed)
  assert _int8_conversions(_program("s3r_ec_dx"), T * H, backward=False) == 1
  assert _int8_conversions(_program("s3r_ec_dx"), T * F, backward=False) == 1
  assert _int8_conversions(_program("s3r_ec"), T * H, backward=False) == 2
  assert _int8_conversions(_program("s3r_ec"), T * F, backward=False) == 2


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_full_size_random_bits_or_thresholds_reach_memory_on_the_v5p(recipe):
  # XLA:TPU fuses the random bits into the quantizer fusions for every recipe, independent SR included
  # (XLA:CPU writes int8_sr's out: tests/quant/test_structure.py), so this holds without a failing contrast
  text = _program(recipe)
  for n in (T * H, T * F):
    buffers = hlo.full_size_buffers(text, n)
    assert not [b for b in buffers if b[1] in ("u32", "u8", "u16")], buffers


def test_plain_s3r_keeps_exactly_the_full_size_buffers_of_rtne_on_the_v5p():
  for n in (T * H, T * F):
    s3r_buffers = sorted(b[1] for b in hlo.full_size_buffers(_program("s3r"), n))
    assert s3r_buffers == sorted(b[1] for b in hlo.full_size_buffers(_program("int8_rtne"), n))
