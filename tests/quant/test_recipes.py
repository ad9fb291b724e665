"""The recipe registry: names of docs/algorithm.md, lookups and validation."""

from typing import Any, cast

import pytest

import s3r
from s3r.quant.recipes import Recipe

SPEC_NAMES = [
  "bf16",
  "int8_rtne",
  "int8_sr",
  "s3r",
  "s3r_bcast",
  "s3r_ec",
  "s3r_ec_dx",
  "s3r_ec_bcast",
  "s3r_ec_dx_bcast",
]


def test_registry_has_every_recipe_of_the_spec_plus_diagnostics():
  assert set(SPEC_NAMES) <= set(s3r.RECIPES)
  assert set(s3r.DIAGNOSTIC_RECIPES) <= set(s3r.RECIPES)
  for name, r in s3r.RECIPES.items():
    assert r.name == name and r.description


def test_recipe_lookup_returns_registered_recipe_and_passes_recipes_through():
  r = s3r.recipe("s3r_ec_dx")
  assert (r.rounding, r.dx_topology, r.correct_dx, r.correct_dw) == ("shared", "token", True, False)
  assert s3r.recipe(r) is r


def test_unknown_recipe_name_raises_value_error_listing_valid_names():
  with pytest.raises(ValueError, match="unknown recipe 'int4'.*s3r_ec_dx"):
    s3r.recipe("int4")
  with pytest.raises(TypeError, match="recipe must be"):
    s3r.recipe(cast(Any, 3))  # not a recipe, on purpose


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(rounding="stochastic"), "rounding"),
    (dict(rounding="shared", dx_topology="row", dw_topology="token"), "dx_topology"),
    (dict(rounding="rtne", dw_topology="token"), "dw_topology"),
    (dict(rounding="sr", correct_dx=True), "correct_dx"),
  ],
)
def test_invalid_recipe_fields_raise_errors_naming_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    Recipe(name="bad", **kwargs)


def test_stochastic_and_split_flags_follow_the_rounding():
  assert not s3r.recipe("bf16").quantized
  assert not s3r.recipe("int8_rtne").stochastic
  assert s3r.recipe("int8_sr").split and s3r.recipe("s3r_split_dx2d_dwbcast").split
  assert not s3r.recipe("s3r_ec").split
