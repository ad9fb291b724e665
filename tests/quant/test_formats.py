"""Number formats: the registry, validation, the int8 grid and the recipes' gradient format."""

import dataclasses
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r.quant import formats, numerics
from s3r.quant.formats import (
  FORMATS,
  FORWARD_FORMAT,
  BlockFloatFormat,
  E2M1Format,
  FloatFormat,
  Format,
  UniformFormat,
  get_format,
)
from s3r.quant.recipes import Recipe

# dtypes as users spell them (NumPy types, names): the constructor normalizes them to np.dtype
INT8: dict[str, Any] = dict(name="int8x", qmax=127, code_dtype=np.int8, acc_dtype=np.int32)
UNIFORM = sorted(n for n, f in FORMATS.items() if f.grid == "uniform")  # FP4 and FP8: test_formats_codes.py


def test_registry_names_every_format_and_the_lookup_returns_it():
  assert "int8" in FORMATS
  for name, f in FORMATS.items():
    assert f.name == name and get_format(name) is f
    assert get_format(f) is f  # a Format passes through
    assert f.grid in formats.GRIDS and isinstance(f, Format)


def test_unknown_format_raises_one_line_listing_the_valid_names():
  with pytest.raises(ValueError, match="unknown number format 'int3'; valid names: .*int8") as err:
    get_format("int3")
  assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="unknown number format 3"):
    get_format(cast(Any, 3))  # not a name, on purpose


def test_forward_format_is_int8_on_the_symmetric_int8_range():
  assert FORWARD_FORMAT is FORMATS["int8"]
  assert FORWARD_FORMAT.qmax == np.iinfo(np.int8).max
  assert FORWARD_FORMAT.code_dtype == np.int8 and FORWARD_FORMAT.acc_dtype == np.int32
  assert numerics.QMAX == FORWARD_FORMAT.qmax and numerics.INV_QMAX == np.float32(1 / FORWARD_FORMAT.qmax)


def test_a_valid_format_normalizes_its_dtypes_and_is_hashable():
  f = UniformFormat(**(INT8 | {"code_dtype": "int8", "acc_dtype": "int32"}))
  assert f.code_dtype == np.dtype(np.int8) and f.acc_dtype == np.dtype(np.int32)
  assert hash(f) == hash(UniformFormat(**INT8))
  # codes held as floats (an emulated grid) accumulate in a float at least as wide
  fp4 = E2M1Format(name="fp4x", block=8, block_scale="e8m0")
  assert fp4.code_dtype == fp4.acc_dtype == np.float32
  # FP8 codes (whose dtype NumPy does not call a float) are accepted and accumulate in f32
  fp8 = FloatFormat(name="fp8x", qmax=448, code_dtype=cast(Any, "float8_e4m3fn"))
  assert fp8.code_dtype == jnp.float8_e4m3fn and fp8.acc_dtype == np.float32


def test_format_is_an_interface_with_one_class_per_kind_of_grid():
  with pytest.raises(TypeError):
    cast(Any, Format)(**INT8)  # abstract: a format is one of its grid classes
  kinds = {type(f) for f in FORMATS.values()}
  assert {k.grid for k in kinds} == set(formats.GRIDS)
  for f in FORMATS.values():
    assert isinstance(f.capabilities, formats.Capabilities)
    assert f.emulated == (not f.capabilities.native_gemm)
    assert f.capabilities.integer_codes == (f.code_dtype.kind in "iu")


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(name=""), "name"),
    (dict(code_dtype=np.float32, acc_dtype=np.float32), "code_dtype"),
    (dict(qmax=0), "qmax"),
    (dict(qmax=True), "qmax"),
    (dict(qmax=7.0), "qmax"),
    (dict(qmax=np.iinfo(np.int8).max + 1), "qmax"),
    (dict(code_dtype="not-a-dtype"), "code_dtype"),
    (dict(code_dtype=np.complex64), "code_dtype"),
    (dict(acc_dtype=np.bool_), "acc_dtype"),
    (dict(acc_dtype=np.int8), "acc_dtype"),
    (dict(acc_dtype=np.float32), "acc_dtype"),
    (dict(code_dtype=np.float32, acc_dtype=np.float16), "acc_dtype"),
  ],
)
def test_invalid_format_fields_raise_errors_naming_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    UniformFormat(**INT8 | kwargs)


@pytest.mark.parametrize(
  "cls, kwargs, field",
  [
    (E2M1Format, dict(block=0, block_scale="e4m3"), "block"),
    (E2M1Format, dict(block=16, block_scale="none"), "block_scale"),
    (E2M1Format, dict(block=16, block_scale="e4m3", qmax=7), "qmax"),
    (E2M1Format, dict(block=16, block_scale="e4m3", code_dtype=np.int8, acc_dtype=np.int32), "code_dtype"),
    (FloatFormat, dict(qmax=440, code_dtype="float8_e4m3fn"), "qmax"),
    (FloatFormat, dict(qmax=127, code_dtype=np.int8, acc_dtype=np.int32), "code_dtype"),
    (FloatFormat, dict(qmax=57344, code_dtype="float8_e5m2", acc_dtype="float8_e5m2"), "acc_dtype"),
    (BlockFloatFormat, dict(qmax=448, element_dtype=np.int8, block=32, block_scale="e8m0"), "element_dtype"),
    (BlockFloatFormat, dict(qmax=448, element_dtype="bfloat16", block=32, block_scale="e8m0"), "element_dtype"),
    (BlockFloatFormat, dict(qmax=6, element_dtype="float4_e2m1fn", block=32, block_scale="e8m0"), "element_dtype"),
    (BlockFloatFormat, dict(qmax=448, element_dtype="float8_e8m0fnu", block=32, block_scale="e8m0"), "element_dtype"),
    (BlockFloatFormat, dict(qmax=448, element_dtype="float8_e5m2", block=32, block_scale="e8m0"), "qmax"),
    (BlockFloatFormat, dict(qmax=448, element_dtype="float8_e4m3fn", block=0, block_scale="e8m0"), "block"),
    (BlockFloatFormat, dict(qmax=448, element_dtype="float8_e4m3fn", block=32, block_scale="f32"), "block_scale"),
  ],
)
def test_invalid_grid_fields_raise_errors_naming_the_field(cls, kwargs, field):
  with pytest.raises(ValueError, match=f"{cls.__name__}.{field}"):
    cls(name="x", **kwargs)


def test_format_is_frozen_and_keyword_only():
  with pytest.raises(dataclasses.FrozenInstanceError):
    cast(Any, FORWARD_FORMAT).qmax = 1
  with pytest.raises(TypeError):
    cast(Any, UniformFormat)("int8x", 127, np.int8, np.int32)


def test_duplicate_names_and_conflicting_accumulators_are_rejected():
  f = UniformFormat(**INT8)
  with pytest.raises(ValueError, match="int8x"):
    formats._registry((f, f))
  wide = UniformFormat(**(INT8 | {"name": "int8w", "acc_dtype": np.int64}))
  with pytest.raises(ValueError, match="acc_dtype"):
    formats._registry((f, wide))


@pytest.mark.parametrize("name", UNIFORM)
def test_every_code_of_the_grid_survives_dequantize_and_round(name):
  f = FORMATS[name]
  codes = jnp.arange(-f.qmax, f.qmax + 1).astype(f.code_dtype)
  step = f.scale(jnp.float32(3.7))
  v = f.dequantize(codes, step) * numerics.reciprocal(step)
  np.testing.assert_array_equal(np.asarray(f.round(v)), np.asarray(codes))
  np.testing.assert_array_equal(np.asarray(f.dequantize(codes)), np.asarray(codes, np.float32))


@pytest.mark.parametrize("name", UNIFORM)
def test_rounding_clips_to_the_grid_and_rounds_half_to_even(name, rng):
  f = FORMATS[name]
  v = jnp.asarray(rng.uniform(-3 * f.qmax, 3 * f.qmax, 512), jnp.float32)
  for threshold in (None, jnp.asarray(rng.uniform(0, 1, 512), jnp.float32)):
    q = np.asarray(f.round(v, threshold))
    assert q.dtype == f.code_dtype and q.min() == -f.qmax and q.max() == f.qmax
    inside = np.abs(np.asarray(v)) < f.qmax - 1
    expected = np.round(np.asarray(v)) if threshold is None else np.floor(np.asarray(v + threshold))
    np.testing.assert_array_equal(q[inside], expected[inside])
  np.testing.assert_array_equal(np.asarray(f.round(jnp.asarray([0.5, 1.5, -2.5]))), [0, 2, -2])


@pytest.mark.parametrize("name", UNIFORM)
def test_step_maps_the_max_onto_the_largest_code_and_zero_onto_one(name):
  f = FORMATS[name]
  amax = jnp.asarray([0.0, 1.0, 254.0, 1e-3], jnp.float32)
  step = np.asarray(f.scale(amax))
  assert step[0] == 1
  np.testing.assert_array_equal(step[1:], np.asarray(amax[1:]) * np.float32(1 / f.qmax))
  q = f.round(amax[1:] * numerics.reciprocal(jnp.asarray(step[1:])))
  np.testing.assert_array_equal(np.asarray(q), [f.qmax] * 3)


def test_code_gemms_accumulate_in_the_format_accumulator():
  f = FORWARD_FORMAT
  a = jnp.full((2, 300), f.qmax, f.code_dtype)
  acc = f.dot_general(a, a, (((1,), (1,)), ((), ())))
  assert acc.dtype == f.acc_dtype and int(acc[0, 0]) == 300 * f.qmax**2  # beyond int16: exact
  assert formats.accumulator(f.code_dtype) == f.acc_dtype
  assert formats.accumulator(jnp.bfloat16) == np.float32


def test_recipes_default_to_int8_gradients_and_reject_unknown_formats():
  assert Recipe(name="x", rounding="rtne").grad_format == "int8"
  assert all(r.grad_format in FORMATS for r in s3r.RECIPES.values())
  with pytest.raises(ValueError, match="grad_format.*int8.*'int3'"):
    Recipe(name="x", rounding="rtne", grad_format="int3")


@pytest.mark.parametrize("recipe", ["int8_rtne", "int8_sr", "s3r", "s3r_split_dx2d_dwbcast"])
def test_gradient_codes_are_in_the_recipes_format(recipe, rng):
  f = get_format(s3r.recipe(recipe).grad_format)
  x = jnp.asarray(rng.standard_normal((2, 6, 8)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((8, 5)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((2, 6, 5)), jnp.float32)
  for q in s3r.gradient_codes(x, w, g, key=jax.random.key(0), recipe=recipe)[:2]:
    assert q.dtype == f.code_dtype and int(jnp.max(jnp.abs(q.astype(jnp.int32)))) <= f.qmax
