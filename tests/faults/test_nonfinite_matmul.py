"""A NaN or an Inf anywhere in a quantized layer's inputs is never turned into a finite number.

For every registered recipe (and every gradient format), dense (`qmatmul`) and grouped
(`grouped_qmatmul`), one non-finite element injected into x, into w or into the upstream gradient
leaves at least as many non-finite elements in the output Y and in both gradients dX and dW as the
unquantized `bf16` product shows (docs/algorithm.md, "Non-finite values"). The shapes include
those at which XLA:CPU's vectorized max reduction drops a NaN, so a scale taken from a plain
`jnp.max` would hide it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r.quant import formats, recipes

DENSE_SHAPES = ((4, 16, 64), (2, 8, 256), (2, 8, 32))  # [B, S, K]; the first two hid a NaN before
N_OUT = 32
# where the bad value goes: (operand, index into it); the gradient's index is into Y [B, S, N]
INJECTIONS = tuple((operand, bad) for operand in ("x", "w", "g") for bad in (np.nan, np.inf, -np.inf))


def _recipes_at(grad_formats) -> list[str]:
  """Every registered recipe name; those that quantize the gradient also at each of `grad_formats`."""
  names = list(recipes.RECIPES)
  for name, r in recipes.RECIPES.items():
    if r.quantized_gradient:
      names += [f"{name}{recipes.FORMAT_SEPARATOR}{f}" for f in grad_formats if f != r.grad_format]
  return names


ALL_FORMATS = tuple(formats.FORMATS)
INTEGER_FORMATS = tuple(n for n, f in formats.FORMATS.items() if f.capabilities.integer_codes)
# the default suite: every registered recipe at int8, and the recommended one at every format
FAST_DENSE = list(recipes.RECIPES) + [f"{recipes.DEFAULT_RECIPE}@{f}" for f in ALL_FORMATS if f != "int8"]
SLOW_DENSE = [r for r in _recipes_at(ALL_FORMATS) if r not in FAST_DENSE]
FAST_GROUPED = list(recipes.RECIPES) + [f"{recipes.DEFAULT_RECIPE}@{f}" for f in INTEGER_FORMATS if f != "int8"]
SLOW_GROUPED = [r for r in _recipes_at(INTEGER_FORMATS) if r not in FAST_GROUPED]


def _nonfinite(a: jax.Array) -> int:
  return int(jnp.sum(~jnp.isfinite(a.astype(jnp.float32))))


def _inject(arrays: dict, operand: str, bad: float) -> dict:
  out = dict(arrays)
  a = np.array(arrays[operand], copy=True)
  index = tuple(d // 2 for d in a.shape)  # an interior element (the first example of two is not)
  a[index] = bad
  out[operand] = jnp.asarray(a)
  return out


def _counts(fn, arrays: dict) -> tuple[int, int, int]:
  y, dx, dw = fn(arrays["x"], arrays["w"], arrays["g"])
  return _nonfinite(y), _nonfinite(dx), _nonfinite(dw)


@functools.cache
def _dense_fn(recipe: str):
  def run(x, w, g):
    y, vjp = jax.vjp(lambda x, w: s3r.qmatmul(x, w, key=jax.random.key(7), recipe=recipe), x, w)
    return (y, *vjp(g))

  return jax.jit(run)


@functools.cache
def _grouped_fn(recipe: str, group_sizes: tuple[int, ...]):
  sizes = jnp.asarray(group_sizes, jnp.int32)

  def run(x, w, g):
    call = lambda x, w: s3r.grouped_qmatmul(x, w, sizes, key=jax.random.key(7), recipe=recipe)  # noqa: E731
    y, vjp = jax.vjp(call, x, w)
    return (y, *vjp(g))

  return jax.jit(run)


def _dense_arrays(shape) -> dict:
  rng = np.random.default_rng(0)
  b, s, k = shape
  return {
    "x": jnp.asarray(rng.standard_normal((b, s, k)), jnp.float32),
    "w": jnp.asarray(rng.standard_normal((k, N_OUT)), jnp.float32),
    "g": jnp.asarray(rng.standard_normal((b, s, N_OUT)), jnp.float32),
  }


def _check_dense(recipe: str, shapes=DENSE_SHAPES):
  for shape in shapes:
    arrays = _dense_arrays(shape)
    assert _counts(_dense_fn(recipe), arrays) == (0, 0, 0)
    for operand, bad in INJECTIONS:
      poisoned = _inject(arrays, operand, bad)
      got, floor = _counts(_dense_fn(recipe), poisoned), _counts(_dense_fn("bf16"), poisoned)
      assert all(g >= f for g, f in zip(got, floor, strict=True)), (
        f"{recipe}, {bad} in {operand} of shape {shape}: non-finite (Y, dX, dW) {got}, bf16 {floor}"
      )
      assert any(got), (recipe, operand, bad, shape)


@pytest.mark.parametrize("recipe", FAST_DENSE)
def test_dense_layer_never_turns_a_nonfinite_input_finite(recipe):
  _check_dense(recipe, DENSE_SHAPES[:1])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", SLOW_DENSE + FAST_DENSE)
def test_dense_layer_never_turns_a_nonfinite_input_finite_at_every_format_and_shape(recipe):
  _check_dense(recipe)


GROUP_SIZES = (5, 0, 20, 7)  # an empty expert; 32 rows of 40 used, the rest padding
ROWS, K_IN, EXPERTS = 40, 64, len(GROUP_SIZES)


def _grouped_arrays() -> dict:
  rng = np.random.default_rng(1)
  return {
    "x": jnp.asarray(rng.standard_normal((ROWS, K_IN)), jnp.float32),
    "w": jnp.asarray(rng.standard_normal((EXPERTS, K_IN, N_OUT)), jnp.float32),
    "g": jnp.asarray(rng.standard_normal((ROWS, N_OUT)), jnp.float32),
  }


def _check_grouped(recipe: str):
  arrays = _grouped_arrays()
  fn = _grouped_fn(recipe, GROUP_SIZES)
  assert _counts(fn, arrays) == (0, 0, 0)
  # row 10 belongs to expert 2 (rows 5..24); w[2] is that expert's weight
  for operand, index in (("x", (10, 3)), ("w", (2, 3, 4)), ("g", (10, 4))):
    for bad in (np.nan, np.inf, -np.inf):
      a = np.array(arrays[operand], copy=True)
      a[index] = bad
      poisoned = {**arrays, operand: jnp.asarray(a)}
      got, floor = _counts(fn, poisoned), _counts(_grouped_fn("bf16", GROUP_SIZES), poisoned)
      assert all(g >= f for g, f in zip(got, floor, strict=True)), (
        f"{recipe}, {bad} in {operand}: non-finite (Y, dX, dW) {got}, bf16 {floor}"
      )
      assert any(got), (recipe, operand, bad)


@pytest.mark.parametrize("recipe", FAST_GROUPED)
def test_grouped_layer_never_turns_a_nonfinite_input_finite(recipe):
  _check_grouped(recipe)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", SLOW_GROUPED)
def test_grouped_layer_never_turns_a_nonfinite_input_finite_at_every_format(recipe):
  _check_grouped(recipe)


def test_one_nan_in_a_wide_row_makes_that_row_of_the_output_nan_as_in_bf16():
  """The case that hid a NaN: one NaN in x [4, 16, 64] (and [2, 8, 256]) gives a whole NaN row."""
  for shape in DENSE_SHAPES[:2]:
    arrays = _dense_arrays(shape)
    x = np.array(arrays["x"])
    x[1, 3, 5] = np.nan
    for recipe in ("int8_rtne", recipes.DEFAULT_RECIPE):
      y = s3r.qmatmul(jnp.asarray(x), arrays["w"], key=jax.random.key(0), recipe=recipe)
      assert bool(jnp.all(jnp.isnan(y[1, 3]))), (recipe, shape)
      assert _nonfinite(jnp.delete(y.reshape(-1, N_OUT), 1 * shape[1] + 3, axis=0)) == 0
