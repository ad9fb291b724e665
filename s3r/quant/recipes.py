"""Rounding recipes: the only thing that differs between the INT8 training modes.

A `Recipe` says how the backward pass turns the scaled upstream gradient G' into codes Q
(docs/algorithm.md §1): round to nearest, independent stochastic rounding, or shared
stochastic rounding with one threshold per token ("token", Φ2D) or per example
("example", Φbcast), which of the two backward products gets the S3R-EC correction, and the
number format of Q (`grad_format`, a name in formats.FORMATS) and of the forward's codes
(`forward_format`: int8, or E4M3 for an all-FP8 recipe).

Every registered recipe that quantizes the gradient exists at every gradient format: `recipe("s3r_ec_dx@int4")`
is `s3r_ec_dx` with `grad_format="int4"` (named "s3r_ec_dx@int4"), and so on for each name in
formats.FORMATS. Every quantized recipe also exists with an E4M3 forward: `recipe("s3r_ec_dx@e5m2+fwd_e4m3")`
is `s3r_ec_dx` with E5M2 gradient codes and E4M3 forward codes, an all-FP8 recipe whose six GEMMs
per layer are FP8 GEMMs (native on Hopper, see formats/). The registered names themselves use int8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from s3r.quant import formats, thresholds

Rounding = Literal["none", "rtne", "sr", "shared", "exact"]

_ROUNDINGS = ("none", "rtne", "sr", "shared", "exact")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  """How one quantized linear layer computes its forward and backward pass."""

  name: str  # registry name, e.g. "s3r_ec_dx"
  rounding: Rounding  # "none" = bf16; "rtne"; "sr" = independent; "shared" = S3R; "exact" = f32 backward (diagnostic)
  dx_topology: str | None = None  # shared thresholds of the dX product: "token", "example" (thresholds.TOPOLOGIES)
  dw_topology: str | None = (
    None  # shared thresholds of the dW product; differs from dx_topology only in split diagnostics
  )
  correct_dx: bool = False  # S3R-EC: subtract the structured rounding error from dX
  correct_dw: bool = False  # S3R-EC: subtract the structured rounding error from dW
  grad_format: str = "int8"  # number format of the backward's gradient codes Q (formats.FORMATS)
  forward_format: str = "int8"  # number format of the forward's activation and weight codes (formats.FORWARD_FORMATS)
  description: str = ""  # one line for `s3r recipes`

  def __post_init__(self):
    if self.rounding not in _ROUNDINGS:
      raise ValueError(f"Recipe.rounding must be one of {_ROUNDINGS}, got {self.rounding!r}")
    if not isinstance(self.grad_format, str) or self.grad_format not in formats.FORMATS:
      raise ValueError(f"Recipe.grad_format must be one of {tuple(formats.FORMATS)}, got {self.grad_format!r}")
    if self.grad_format != formats.INT8.name and self.rounding in ("none", "exact"):
      raise ValueError(
        f"Recipe.grad_format must be 'int8' when rounding={self.rounding!r} (no quantized gradient), "
        f"got {self.grad_format!r}"
      )
    if not isinstance(self.forward_format, str) or self.forward_format not in formats.FORWARD_FORMATS:
      raise ValueError(f"Recipe.forward_format must be one of {formats.FORWARD_FORMATS}, got {self.forward_format!r}")
    if self.forward_format != formats.INT8.name and self.rounding == "none":
      raise ValueError(
        f"Recipe.forward_format must be 'int8' when rounding='none' (no quantization), got {self.forward_format!r}"
      )
    shared = self.rounding == "shared"
    for field in ("dx_topology", "dw_topology"):
      value = getattr(self, field)
      if shared and value not in thresholds.shared_topologies():
        raise ValueError(
          f"Recipe.{field} must be one of {thresholds.shared_topologies()} when rounding='shared', got {value!r}"
        )
      if not shared and value is not None:
        raise ValueError(f"Recipe.{field} must be None when rounding={self.rounding!r}, got {value!r}")
    if (self.correct_dx or self.correct_dw) and not shared:
      raise ValueError(f"Recipe.correct_dx/correct_dw need rounding='shared' (S3R-EC), got rounding={self.rounding!r}")
    if (self.correct_dx or self.correct_dw) and self.split:
      raise ValueError(
        "Recipe.correct_dx/correct_dw are not defined for split quantization (dx_topology != dw_topology)"
      )

  def __str__(self) -> str:
    """The name, as a user writes the recipe (`s3r.recipe(str(r)) == r` for every recipe it parses)."""
    return self.name

  @property
  def quantized(self) -> bool:
    """True for every INT8 recipe (all but `bf16`)."""
    return self.rounding != "none"

  @property
  def quantized_gradient(self) -> bool:
    """True when the backward pass quantizes the gradient into codes of `grad_format` and runs two
    GEMMs on codes (every quantized recipe but the exact reference)."""
    return self.quantized and self.rounding != "exact"

  @property
  def stochastic(self) -> bool:
    """True when the backward pass draws random numbers, so a PRNG key is required."""
    return self.rounding in ("sr", "shared")

  @property
  def threshold_topologies(self) -> tuple[thresholds.Topology, thresholds.Topology]:
    """The threshold topologies (dX's, dW's) of a stochastic recipe: `Independent` for "sr", the
    named shared ones for "shared"."""
    if self.rounding == "sr":
      return thresholds.TOPOLOGIES["independent"], thresholds.TOPOLOGIES["independent"]
    if self.rounding != "shared":
      raise ValueError(f"recipe {self.name!r} (rounding={self.rounding!r}) draws no thresholds")
    dx, dw = self.dx_topology, self.dw_topology
    names = thresholds.shared_topologies()
    if dx not in names or dw not in names:
      raise ValueError(f"recipe {self.name!r}: threshold topology must be one of {names}, got {dx!r}, {dw!r}")
    return thresholds.TOPOLOGIES[dx], thresholds.TOPOLOGIES[dw]

  @property
  def split(self) -> bool:
    """True when G' is quantized twice (once per backward product)."""
    return self.rounding == "sr" or (self.rounding == "shared" and self.dx_topology != self.dw_topology)


def _shared(name, topo, *, dx=False, dw=False, dw_topo=None, description):
  return Recipe(
    name=name,
    rounding="shared",
    dx_topology=topo,
    dw_topology=dw_topo or topo,
    correct_dx=dx,
    correct_dw=dw,
    description=description,
  )


_RECIPES = (
  Recipe(name="bf16", rounding="none", description="no quantization: bf16 operands, f32 accumulation"),
  Recipe(name="int8_rtne", rounding="rtne", description="INT8, gradient rounded to nearest even (biased)"),
  Recipe(
    name="int8_sr",
    rounding="sr",
    description="INT8, independent stochastic rounding: two full-size uniform draws, G' quantized twice",
  ),
  _shared("s3r", "token", description="S3R: one shared threshold per token, one Q for both products"),
  _shared("s3r_bcast", "example", description="S3R ablation: one shared threshold per example"),
  _shared("s3r_ec", "token", dx=True, dw=True, description="S3R-EC: per-token thresholds, dX and dW corrected"),
  _shared("s3r_ec_dx", "token", dx=True, description="S3R-EC: per-token thresholds, dX corrected (recommended)"),
  _shared(
    "s3r_ec_bcast", "example", dx=True, dw=True, description="S3R-EC: per-example thresholds, dX and dW corrected"
  ),
  _shared("s3r_ec_dx_bcast", "example", dx=True, description="S3R-EC: per-example thresholds, dX corrected"),
  # Diagnostic variants (Table II of the paper).
  _shared("s3r_ec_dw", "token", dw=True, description="diagnostic: per-token thresholds, dW-only correction"),
  _shared("s3r_ec_dw_bcast", "example", dw=True, description="diagnostic: per-example thresholds, dW-only correction"),
  _shared(
    "s3r_split_dx2d_dwbcast",
    "token",
    dw_topo="example",
    description="diagnostic: G' quantized twice, dX per-token / dW per-example thresholds",
  ),
  _shared(
    "s3r_split_dxbcast_dw2d",
    "example",
    dw_topo="token",
    description="diagnostic: G' quantized twice, dX per-example / dW per-token thresholds",
  ),
  Recipe(
    name="int8_exact_bwd",
    rounding="exact",
    description="reference: INT8 forward, exact f32 backward of that forward graph (for gradient errors)",
  ),
)

RECIPES: dict[str, Recipe] = {r.name: r for r in _RECIPES}
"""Every registered recipe by name. `recipe(name)` also takes `NAME@FORMAT` (another gradient format)."""
DEFAULT_RECIPE = "s3r_ec_dx"
"""The recommended recipe, the default of every API and of `s3r train --recipe`."""
DIAGNOSTIC_RECIPES = (
  "s3r_ec_dw",
  "s3r_ec_dw_bcast",
  "s3r_split_dx2d_dwbcast",
  "s3r_split_dxbcast_dw2d",
  "int8_exact_bwd",
)
"""The recipes that isolate one part of S3R or S3R-EC (a correction of dW only, G' quantized twice, the
exact backward of the INT8 forward): for measuring errors, not for training."""


FORMAT_SEPARATOR = "@"  # "s3r_ec_dx@int4": a registered recipe at another gradient format
FORWARD_SEPARATOR = "+fwd_"  # "s3r_ec_dx@e5m2+fwd_e4m3": ... with another forward format


def recipe(name_or_recipe: str | Recipe) -> Recipe:
  """Returns the recipe called `name_or_recipe` (a Recipe passes through, a name is `parse`d): a registered name, or
  "NAME@FORMAT" for registered recipe NAME with gradient format FORMAT (see `at_format`), either
  optionally followed by "+fwd_FORWARD" for forward format FORWARD (see `at_forward_format`)."""
  if isinstance(name_or_recipe, Recipe):
    return name_or_recipe
  if not isinstance(name_or_recipe, str):
    raise TypeError(f"recipe must be a Recipe or one of {sorted(RECIPES)}, got {type(name_or_recipe).__name__}")
  return parse(name_or_recipe)


def parse(name: str) -> Recipe:
  """The recipe that `name` (NAME, NAME@FORMAT, NAME[@FORMAT]+fwd_FORWARD) names; ValueError listing the valid
  names otherwise. The one place a recipe's name is read: the library's entry points call it (through `recipe`)
  where a user's string comes in, and pass the Recipe on."""
  head, fwd_sep, fwd = name.partition(FORWARD_SEPARATOR)
  base, sep, fmt = head.partition(FORMAT_SEPARATOR)
  if base not in RECIPES:
    raise ValueError(
      f"unknown recipe {base!r}; valid names: {', '.join(RECIPES)} "
      f"(optionally NAME{FORMAT_SEPARATOR}FORMAT, FORMAT one of {', '.join(formats.FORMATS)}, then "
      f"{FORWARD_SEPARATOR}FORWARD, FORWARD one of {', '.join(formats.FORWARD_FORMATS)})"
    )
  found = at_format(RECIPES[base], fmt) if sep else RECIPES[base]
  return at_forward_format(found, fwd) if fwd_sep else found


def at_forward_format(base: Recipe, forward_format: str) -> Recipe:
  """`base` with forward format `forward_format`, named "BASE+fwd_FORWARD" (the int8 forward keeps
  the name); refused for `bf16` (no quantized forward) and for a format not in FORWARD_FORMATS."""
  if forward_format == base.forward_format:
    return base
  name = f"{base.name}{FORWARD_SEPARATOR}{forward_format}"
  if not base.quantized:
    raise ValueError(f"recipe {name!r}: {base.name!r} does not quantize the forward, so it has no forward format")
  if forward_format not in formats.FORWARD_FORMATS:
    raise ValueError(
      f"recipe {name!r}: unknown forward format {forward_format!r}; valid: {', '.join(formats.FORWARD_FORMATS)}"
    )
  return dataclasses.replace(base, forward_format=forward_format, name=name)


def at_format(base: Recipe, grad_format: str) -> Recipe:
  """`base` with gradient format `grad_format`, named "BASE@FORMAT"; refused for a recipe without a
  quantized gradient (`bf16`, `int8_exact_bwd`) and for an unknown format."""
  name = f"{base.name}{FORMAT_SEPARATOR}{grad_format}"
  if not base.quantized_gradient:
    raise ValueError(f"recipe {name!r}: {base.name!r} does not quantize the gradient, so it has no gradient format")
  if grad_format not in formats.FORMATS:
    raise ValueError(
      f"recipe {name!r}: unknown gradient format {grad_format!r}; valid formats: {', '.join(formats.FORMATS)}"
    )
  return dataclasses.replace(base, grad_format=grad_format, name=name)


class RecipeField:
  """The recipe field of a frozen config dataclass (`recipe: RecipeField = RecipeField()`): it takes a Recipe, or a
  name that it parses here, once, when the config is built (`recipe`), and holds the Recipe, which is what every
  reader gets. A name that is not a recipe raises `error(value, problem)` where given, else a ValueError naming
  the config class and the field. Serialize the field by its name (`Recipe.name`)."""

  def __init__(self, default: Recipe | None = None, *, error: Callable[[Any, Exception], Exception] | None = None):
    self.default = RECIPES[DEFAULT_RECIPE] if default is None else default
    self.error = error
    self.name = self.attr = ""

  def __set_name__(self, owner: type, name: str) -> None:
    self.name, self.attr = name, f"_{name}"

  def __get__(self, obj: object | None, objtype: type | None = None) -> Recipe:
    return self.default if obj is None else getattr(obj, self.attr)  # on the class: the dataclass's default

  def __set__(self, obj: object, value: Recipe | str) -> None:
    try:
      found = recipe(self.default if value is self else value)
    except (TypeError, ValueError) as e:
      if self.error is not None:
        raise self.error(value, e) from None
      raise ValueError(
        f"{type(obj).__name__}.{self.name} must be a recipe of s3r.quant (NAME or NAME@FORMAT): {e}"
      ) from None
    object.__setattr__(obj, self.attr, found)
