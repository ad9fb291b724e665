"""s3r as a MaxText quantization backend: `quantization=s3r` or `quantization=s3r:RECIPE`.

MaxText selects its quantization with one config value (`quantization=int8` is AQT). `register()`
adds the s3r values to the ones MaxText accepts (its `QuantizationType`) and puts s3r in front of
`maxtext.layers.quantizations.configure_quantization`, which every MaxText model builder calls:
for an s3r value it returns an `S3rQuantization`, for any other value MaxText's own answer.
`python -m s3r.integrations.maxtext ARGS...` is MaxText's pre-training entry point
(`maxtext.trainers.pre_train.train`) with `register()` called first.

Values: `s3r` is the default recipe (`s3r.DEFAULT_RECIPE`, s3r_ec_dx); `s3r:NAME` any recipe by
name (`s3r:int8_rtne`, `s3r:bf16`, `s3r:s3r_ec_dx@int4`); `quantization_values()` lists them.

What it quantizes: every MaxText `DenseGeneral` built with the quantization object (the attention and MLP
projections; MaxText gives the output projection `logits_dense` none) takes its `dot_general` from
`S3rQuantization.dot_general_cls`, the AQT-style hook: an `s3r.nn.LinenDotGeneral` that MaxText
runs through its Linen-to-NNX bridge. Its backward-pass key is drawn from MaxText's `aqt` RNG
stream: each layer's bridge owns a fork of the model's `aqt` stream and draws a new key on every
call, and the stream's count is model state that the train step carries, so keys are fresh per
step and per layer and depend on the seed and the step only, not on the mesh (the random bits drawn
from them do too under threefry; MaxText's trainer switches to `unsafe_rbg`, see docs/maxtext.md). The kernel's
fingerprint is folded in as everywhere in s3r (layers under `scan_layers` differ).
Tensor-parallel partial sums: where the kernel's logical axes put its contracted dimension on
the `tensor` mesh axis the projection runs with `tp="row"`, where they put its output dimension
there with `tp="column"` (see `s3r.qmatmul`); with `ici_tensor_parallelism=1` neither applies.

Not wired: the mixture-of-experts layers (their expert GEMMs do not go through `dot_general_cls`),
so an MoE config (`num_experts > 1`) raises rather than leaving the experts unquantized; Qwix's
path (`use_qwix_quantization=True`), which deletes the modules' RNG streams; serving and conversion
modes (`quant_mode_str` other than "train"); MaxText's batch-split schedule.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import flax.linen as linen

from s3r.nn.dot_general import LinenDotGeneral, dot_general
from s3r.quant import formats
from s3r.quant.recipes import DEFAULT_RECIPE, FORMAT_SEPARATOR, RECIPES, Recipe
from s3r.quant.recipes import recipe as get_recipe

PREFIX = "s3r"  # the config value of the default recipe; "s3r:NAME" names a recipe
SEPARATOR = ":"
RNG_STREAM = "aqt"  # MaxText's RNG stream for quantization (AQT's stochastic rounding draws from it too)
TENSOR_AXIS = "tensor"  # MaxText's tensor-parallel mesh axis
INSTALL_HINT = "pip install 's3r[maxtext]'"


def quantization_values() -> tuple[str, ...]:
  """Every `quantization=` value that selects s3r: "s3r" and "s3r:NAME" for each recipe name,
  NAME@FORMAT included for the recipes with a quantized gradient."""
  names = list(RECIPES)
  names += [
    f"{name}{FORMAT_SEPARATOR}{fmt}" for name, r in RECIPES.items() if r.int8_backward for fmt in formats.FORMATS
  ]
  return (PREFIX, *(f"{PREFIX}{SEPARATOR}{name}" for name in names))


def parse(value: Any) -> Recipe | None:
  """The recipe a `quantization=` value selects, or None if the value is not an s3r one.

  "s3r" is the default recipe, "s3r:NAME" the recipe NAME (an unknown NAME raises, naming the
  valid ones). A MaxText `QuantizationType` member is read by its value.
  """
  text = value.value if isinstance(value, enum.Enum) else value
  if not isinstance(text, str):
    return None
  if text == PREFIX:
    return get_recipe(DEFAULT_RECIPE)
  head, sep, name = text.partition(SEPARATOR)
  if head != PREFIX or not sep:
    return None
  try:
    return get_recipe(name)
  except ValueError as err:
    raise ValueError(f"quantization={text!r}: {err}") from None


def tensor_parallel_kind(
  mesh_axes: Sequence[tuple[str, ...]], rhs_contract: Sequence[int], axis: str = TENSOR_AXIS
) -> str | None:
  """The `tp=` of a projection whose kernel dims sit on `mesh_axes` (the mesh axes of each dim):
  "row" when `axis` splits a contracted dim, "column" when it splits an output dim, else None."""
  on_axis = [d for d, names in enumerate(mesh_axes) if axis in names]
  if not on_axis:
    return None
  contracted = [d for d in on_axis if d in rhs_contract]
  if contracted and len(contracted) == len(on_axis):
    return "row"
  return "column" if not contracted else None


def _mesh_axes(kernel_axes: tuple, ndim: int) -> list[tuple[str, ...]]:
  """Mesh axes of each kernel dim under the current logical axis rules ([()] * ndim without rules)."""
  if len(kernel_axes) != ndim or not linen.get_logical_axis_rules():
    return [()] * ndim
  spec = linen.logical_to_mesh_axes(kernel_axes)
  out = []
  for entry in spec:
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    out.append(tuple(n for n in names if isinstance(n, str)))
  return out


class MaxTextDotGeneral(LinenDotGeneral):
  """`LinenDotGeneral` keyed from MaxText's `aqt` stream, with the tensor-parallel split of the kernel
  read from its logical axes (`kernel_axes`, what MaxText passes to `dot_general_cls` as `mesh_axes`)."""

  rng_collection: str = RNG_STREAM
  kernel_axes: tuple = ()

  @linen.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    recipe = get_recipe(self.recipe)
    key = self.make_rng(self.rng_collection) if recipe.stochastic and self.has_rng(self.rng_collection) else None
    rhs_contract = tuple(d % rhs.ndim for d in dimension_numbers[0][1])
    tp = self.tp or tensor_parallel_kind(_mesh_axes(self.kernel_axes, rhs.ndim), rhs_contract, self.tp_axis)
    return dot_general(recipe, key, tp=tp, tp_axis=self.tp_axis, fold_kernel=True)(
      lhs, rhs, dimension_numbers, preferred_element_type=preferred_element_type, **kwargs
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class S3rQuantization:
  """What `configure_quantization` returns for an s3r value: MaxText asks it for `dot_general_cls`."""

  needs_apply_rngs: ClassVar[bool] = True  # the backward draws from the `aqt` stream at apply time
  quant_mode: ClassVar[str] = "train"  # MaxText compares it with AQT's serve/convert modes

  recipe: Recipe
  tensor_axis: str = TENSOR_AXIS

  def __post_init__(self):
    if not isinstance(self.recipe, Recipe):
      raise TypeError(f"S3rQuantization.recipe must be an s3r Recipe, got {type(self.recipe).__name__}")

  def dot_general_cls(self, mesh_axes: tuple = ()):
    """The Linen `dot_general` module MaxText's DenseGeneral builds (`mesh_axes`: the kernel's logical axes)."""
    return functools.partial(
      MaxTextDotGeneral, recipe=self.recipe, kernel_axes=tuple(mesh_axes), tp_axis=self.tensor_axis
    )

  def einsum(self, mesh_axes: tuple = ()):
    raise NotImplementedError(
      f"quantization={PREFIX}{SEPARATOR}{self.recipe.name}: MaxText's einsum path (the MoE experts) is not wired to s3r"
    )


def backend(config: Any, quant_mode_str: str = "train") -> S3rQuantization | None:
  """`S3rQuantization` for a config whose `quantization` is an s3r value, else None; raises for what
  the s3r backend does not cover rather than leaving a part of the model unquantized."""
  recipe = parse(getattr(config, "quantization", None))
  if recipe is None:
    return None
  value = f"quantization={PREFIX}{SEPARATOR}{recipe.name}"
  if quant_mode_str != "train":
    raise NotImplementedError(f"{value}: quant_mode_str={quant_mode_str!r}; the s3r backend is for training only")
  if getattr(config, "use_qwix_quantization", False):
    raise ValueError(
      f"{value} with use_qwix_quantization=True: s3r runs through MaxText's dot_general_cls path (Qwix's path drops "
      "the modules' RNG streams, which s3r's stochastic backward needs); set use_qwix_quantization=False"
    )
  if getattr(config, "use_batch_split_schedule", False):
    raise NotImplementedError(f"{value}: use_batch_split_schedule=True is not supported by the s3r backend")
  if int(getattr(config, "num_experts", 1) or 1) > 1:
    raise NotImplementedError(
      f"{value} with num_experts={config.num_experts}: the s3r MaxText backend quantizes the dense projections only; "
      "MaxText's expert GEMMs are not wired to s3r.grouped_qmatmul, and the experts would silently stay in "
      f"{getattr(config, 'dtype', 'bf16')}. Use a dense model, or s3r's own MoE models (s3r.model)"
    )
  return S3rQuantization(recipe=recipe)


def _member_name(value: str) -> str:
  return value.upper().replace(SEPARATOR, "__").replace(FORMAT_SEPARATOR, "_AT_")


def _extend_enum(cls: type[enum.Enum], values: Sequence[str]) -> None:
  """Adds a member per new value to the str Enum `cls` (Python enums have no public API for it)."""
  for value in values:
    if value in cls._value2member_map_:
      continue
    name = _member_name(value)
    member = str.__new__(cls, value)
    member._name_, member._value_ = name, value
    member.__objclass__ = cls
    member._sort_order_ = len(cls._member_names_)
    type.__setattr__(cls, name, member)
    cls._member_map_[name] = member
    cls._value2member_map_[value] = member
    cls._member_names_.append(name)


def _import_maxtext():
  try:
    from maxtext.configs import types  # noqa: PLC0415
    from maxtext.layers import quantizations  # noqa: PLC0415
  except ModuleNotFoundError as err:
    raise ModuleNotFoundError(f"s3r.integrations.maxtext needs MaxText ({INSTALL_HINT}): {err}") from err
  return types, quantizations


def register() -> None:
  """Makes MaxText accept `quantization=s3r[:RECIPE]` in this process and build s3r's backend for it.

  Extends MaxText's `QuantizationType` with `quantization_values()` (and rebuilds the config
  models that validate it) and wraps `maxtext.layers.quantizations.configure_quantization`.
  Idempotent; call it before MaxText reads its config.
  """
  types, quantizations = _import_maxtext()
  _extend_enum(types.QuantizationType, quantization_values())
  for model in (types.Quantization, types.MaxTextConfig):
    model.model_rebuild(force=True)
  original = quantizations.configure_quantization
  if getattr(original, "s3r_backend", False):
    return

  @functools.wraps(original)
  def configure_quantization(config, quant_mode_str: str = "train"):
    quant = backend(config, quant_mode_str)
    return original(config, quant_mode_str=quant_mode_str) if quant is None else quant

  configure_quantization.s3r_backend = True  # type: ignore[attr-defined]
  quantizations.configure_quantization = configure_quantization


def main(argv: Sequence[str] | None = None) -> None:
  """MaxText's pre-training entry point with s3r registered: `python -m s3r.integrations.maxtext
  base.yml quantization=s3r:s3r_ec_dx ...` takes exactly the arguments of `python -m
  maxtext.trainers.pre_train.train`."""
  register()
  from absl import app  # noqa: PLC0415
  from maxtext.trainers.pre_train import train  # noqa: PLC0415

  app.run(train.main, argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # run as a module: use the imported copy, the one MaxText's code will see
  from s3r.integrations.maxtext import main as _main

  _main()
