"""s3r as a MaxText quantization backend: `quantization=s3r` or `quantization=s3r:RECIPE`.

MaxText selects its quantization with one config value (`quantization=int8` is AQT). `register()`
adds the s3r values to the ones MaxText accepts (its `QuantizationType`) and puts s3r in front of
`maxtext.layers.quantizations.configure_quantization`, which every MaxText model builder calls:
for an s3r value it returns an `S3rQuantization`, for any other value MaxText's own answer.
`python -m s3r.integrations.maxtext ARGS...` is MaxText's pre-training entry point
(`maxtext.trainers.pre_train.train`) with `register()` called first.

Values: `s3r` is the default recipe (`s3r.DEFAULT_RECIPE`, s3r_ec_dx); `s3r:NAME` any recipe by
name (`s3r:int8_rtne`, `s3r:bf16`, `s3r:s3r_ec_dx@int4`, FP8 gradients `s3r:s3r_ec_dx@e5m2`, the all-FP8
`s3r:s3r_ec_dx@e5m2+fwd_e4m3`, whose E4M3 forward runs in the dense projections and the expert GEMMs
alike); `quantization_values()` lists them.

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

Mixture of experts (`num_experts > 1`): the expert GEMMs of MaxText's sparse (dropless) path,
`RoutedMoE.sparse_matmul` with `sparse_matmul=True` and `megablox=True` (MaxText's defaults) or
`use_tokamax_gmm=True`, run through `s3r.grouped_qmatmul` with the recipe (`expert_gmm`). MaxText computes
them in a closure that calls `maxtext.kernels.megablox.gmm` inside a `shard_map` and asks the
quantization object for nothing s3r could answer with a GEMM, so `register()` wraps two MaxText
functions, narrowly (see `_patch_experts`): `RoutedMoE.sparse_matmul` of an s3r layer draws one key per
call from the layer's `aqt` stream (fresh per step and per layer, as the dense hook's) and
`megablox.gmm` runs `expert_gmm` while such a call is traced; other layers and other calls reach
MaxText's code unchanged. Each GEMM uses `fold_in(key, kernel_fingerprint(kernel))`. The router's gate
and any shared experts are `DenseGeneral`-style projections and take the dense hook. `backend()` refuses
the MoE paths it does not cover, naming the config field: `sparse_matmul=False` (the dense einsum/capacity
path), `megablox=False` without Tokamax (a direct `jax.lax.ragged_dot`), expert parallelism through the ragged
all-to-all (unverified: XLA:CPU cannot compile it), TransformerEngine's MoE block, quantized token
all-gathers, embedding chunks. On a mesh of several devices (data, FSDP, tensor parallelism, or expert
parallelism with `use_ring_of_experts=True`) each shard's rows are a grouped product of their own inside
MaxText's `shard_map`, with the shard's index folded into the key (`shard_key`); under the ring of experts
a shard's rows are the gathered tokens of its own experts.

Not wired: Qwix's path (`use_qwix_quantization=True`), which deletes the modules' RNG streams; serving and
conversion modes (`quant_mode_str` other than "train"); MaxText's batch-split schedule.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import functools
import importlib
import inspect
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import flax.linen as linen
import jax
import jax.numpy as jnp

from s3r.nn.dot_general import LinenDotGeneral, dot_general, kernel_fingerprint
from s3r.quant import formats
from s3r.quant.grouped import grouped_qmatmul
from s3r.quant.recipes import DEFAULT_RECIPE, FORMAT_SEPARATOR, FORWARD_SEPARATOR, RECIPES, Recipe
from s3r.quant.recipes import recipe as get_recipe

PREFIX = "s3r"  # the config value of the default recipe; "s3r:NAME" names a recipe
SEPARATOR = ":"
RNG_STREAM = "aqt"  # MaxText's RNG stream for quantization (AQT's stochastic rounding draws from it too)
TENSOR_AXIS = "tensor"  # MaxText's tensor-parallel mesh axis
INSTALL_HINT = "pip install 's3r[maxtext]'"


def quantization_values() -> tuple[str, ...]:
  """Every `quantization=` value that selects s3r: "s3r" and "s3r:NAME" for each recipe name,
  NAME@FORMAT included for the recipes with a quantized gradient, and the all-FP8 recipes
  NAME@e4m3+fwd_e4m3 and NAME@e5m2+fwd_e4m3 (E4M3 forward, FP8 gradients)."""
  names = list(RECIPES)
  names += [
    f"{name}{FORMAT_SEPARATOR}{fmt}" for name, r in RECIPES.items() if r.quantized_gradient for fmt in formats.FORMATS
  ]
  fp8 = [n for n, f in formats.FORMATS.items() if f.grid == "float" and f.capabilities.native_gemm]
  names += [
    f"{name}{FORMAT_SEPARATOR}{fmt}{FORWARD_SEPARATOR}e4m3"
    for name, r in RECIPES.items()
    if r.quantized_gradient
    for fmt in fp8
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
  if spec is None:
    return [()] * ndim
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
      f"quantization={PREFIX}{SEPARATOR}{self.recipe.name}: MaxText's einsum path (the MoE experts with "
      "sparse_matmul=False) is not wired to s3r"
    )

  def expert_key(self, rngs: Any) -> jax.Array | None:
    """The key of one MoE layer call's expert GEMMs: a draw from the layer's `aqt` stream (None for a
    deterministic recipe, or where the layer has no such stream, as for the dense hook)."""
    if not self.recipe.stochastic or rngs is None or RNG_STREAM not in rngs:
      return None
    return getattr(rngs, RNG_STREAM)()


def expert_gmm(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  recipe: Recipe,
  key: jax.Array | None,
  preferred_element_type: Any = None,
) -> jax.Array:
  """One MaxText expert GEMM through s3r: `s3r.grouped_qmatmul(lhs, rhs, group_sizes)` with the key
  `fold_in(key, kernel_fingerprint(rhs))` (the layer call's key, made distinct per expert kernel as the dense
  hook does), in `preferred_element_type` (MaxText's gmm output dtype; None: lhs's).

  `group_sizes` may name more groups than `rhs` holds experts (MaxText's ring of experts passes every
  expert's size with this shard's experts rolled to the front): as in MaxText's gmm with group offset 0,
  the first `rhs.shape[0]` groups are computed and the rows after them are zero."""
  k = None if key is None else jax.random.fold_in(key, kernel_fingerprint(rhs))
  sizes_E = group_sizes.astype(jnp.int32)[: rhs.shape[0]]
  out = grouped_qmatmul(lhs, rhs, sizes_E, key=k, recipe=recipe)
  return out if preferred_element_type is None else out.astype(preferred_element_type)


@dataclasses.dataclass(frozen=True)
class _Experts:
  """What an s3r MoE layer call hands its grouped GEMMs while MaxText traces them."""

  recipe: Recipe
  key: jax.Array | None
  shard_axes: tuple[tuple[str, int], ...] = ()  # (name, size) of the mesh axes of size > 1, in mesh order


def shard_key(key: jax.Array | None, axes: Sequence[tuple[str, int]]) -> jax.Array | None:
  """Inside MaxText's `shard_map`: `key` folded with this shard's linear index over `axes`, so that no two
  shards draw the same thresholds for their rows (None, or no axes: `key` itself)."""
  if key is None or not axes:
    return key
  index = jnp.zeros((), jnp.int32)
  for name, size in axes:
    index = index * size + jax.lax.axis_index(name)
  return jax.random.fold_in(key, index)


# Set only while an s3r `RoutedMoE.sparse_matmul` runs (see register()); MaxText's gmm calls inside see it.
_EXPERTS: contextvars.ContextVar[_Experts | None] = contextvars.ContextVar("s3r_maxtext_experts", default=None)


def _moe_refusal(config: Any) -> str | None:
  """Why the s3r backend cannot quantize this MoE config's expert GEMMs (None where it can): the
  config field and value, and what to do."""
  get = functools.partial(getattr, config)
  if not get("sparse_matmul", True):
    return (
      "sparse_matmul=False (MaxText's dense einsum/capacity expert path) is not wired to s3r; use sparse_matmul=True"
    )
  if not get("megablox", True) and not get("use_tokamax_gmm", False):
    return (
      "megablox=False runs the experts through jax.lax.ragged_dot directly, which has no hook; use megablox=True "
      "(MaxText's default)"
    )
  ep = [(f, v) for f in ("ici_expert_parallelism", "dcn_expert_parallelism") if (v := int(get(f, 1) or 1)) > 1]
  if ep and not get("use_ring_of_experts", False):
    field, value = ep[0]
    return (
      f"{field}={value}: expert parallelism through MaxText's ragged all-to-all is not verified with s3r "
      "(XLA:CPU cannot compile that collective); set use_ring_of_experts=True, which s3r covers"
    )
  for field in ("te_moe_block", "moe_quantize_token_all_gather"):
    if get(field, False):
      return f"{field}=True is not supported on the s3r MaxText expert path"
  if int(get("num_moe_emb_chunks", 0) or 0) > 0:
    return f"num_moe_emb_chunks={get('num_moe_emb_chunks')} is not supported on the s3r MaxText expert path"
  return None


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
  if int(getattr(config, "num_experts", 1) or 1) > 1 and (why := _moe_refusal(config)):
    raise NotImplementedError(f"{value} with num_experts={config.num_experts}: {why}")
  return S3rQuantization(recipe=recipe)


def _member_name(value: str) -> str:
  return value.upper().replace(SEPARATOR, "__").replace(FORMAT_SEPARATOR, "_AT_").replace("+", "_")


def _extend_enum(cls: Any, values: Sequence[str]) -> None:  # a str Enum class (its private tables are written)
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
  _patch_experts()


def _patch_experts() -> None:
  """Routes the expert GEMMs of an s3r MoE layer through `expert_gmm` (two narrow wrappers).

  MaxText's sparse MoE path (`RoutedMoE.sparse_matmul`) computes its expert GEMMs in a closure that
  asks the quantization object for nothing but AQT's dtypes and calls
  `maxtext.kernels.megablox.gmm` inside a `shard_map`, so there is no hook to hand s3r the GEMM:
  - `RoutedMoE.sparse_matmul` is wrapped: for a layer whose `quant` is an `S3rQuantization` it draws the
    call's key from the layer's `aqt` stream (outside the `shard_map`, where the stream's count is model
    state) and sets it, with the recipe, in a context variable while MaxText traces the layer;
    any other layer runs MaxText's method unchanged.
  - `maxtext.kernels.megablox.gmm` (what the sparse path calls with `megablox=True` or
    `use_tokamax_gmm=True`) is wrapped: while that context is set, a call is `expert_gmm` (i.e.
    `s3r.grouped_qmatmul`); otherwise it is MaxText's gmm, unchanged.
  """
  from maxtext.kernels import megablox  # noqa: PLC0415
  from maxtext.layers import moe  # noqa: PLC0415

  _patch_gmm(megablox)
  _patch_sparse_matmul(moe)


def _unsupported_gmm_arguments(a: Mapping[str, Any]) -> list[str]:
  """The options of a bound `megablox.gmm` call that `expert_gmm` does not cover, by name."""
  offset = a["group_offset"]
  unsupported = {
    "group_offset": offset is not None and not (isinstance(offset, int) and offset == 0),
    "existing_out": a["existing_out"] is not None,
    "transpose_rhs": bool(a["transpose_rhs"]),
    "weight_gather_axes": bool(a["weight_gather_axes"]),
    "partial_sum": a["partial_sum"] is not None,
    "a pre-quantized operand": not all(isinstance(v, jax.Array) for v in (a["lhs"], a["rhs"])),
  }
  return [name for name, on in unsupported.items() if on]


def _patch_gmm(megablox) -> None:
  original_gmm = megablox.gmm
  if getattr(original_gmm, "s3r_backend", False):
    return
  signature = inspect.signature(original_gmm)

  @functools.wraps(original_gmm)
  def gmm(*args, **kwargs):
    experts = _EXPERTS.get()
    if experts is None:
      return original_gmm(*args, **kwargs)
    call = signature.bind(*args, **kwargs)
    call.apply_defaults()
    a = call.arguments
    if bad := _unsupported_gmm_arguments(a):
      raise NotImplementedError(f"s3r MaxText expert GEMM: MaxText passed {', '.join(bad)}, which s3r does not cover")
    return expert_gmm(
      a["lhs"],
      a["rhs"],
      a["group_sizes"],
      recipe=experts.recipe,
      key=shard_key(experts.key, experts.shard_axes),
      preferred_element_type=a["preferred_element_type"],
    )

  gmm.s3r_backend = True  # type: ignore[attr-defined]
  megablox.gmm = gmm


def _patch_sparse_matmul(moe) -> None:
  original_sparse = moe.RoutedMoE.sparse_matmul
  if getattr(original_sparse, "s3r_backend", False):
    return

  @functools.wraps(original_sparse)
  def sparse_matmul(self, *args, **kwargs):
    quant = getattr(self, "quant", None)
    if not isinstance(quant, S3rQuantization):
      return original_sparse(self, *args, **kwargs)
    mesh = getattr(self, "mesh", None)
    axes = () if mesh is None else tuple((n, int(z)) for n, z in mesh.shape.items() if z > 1)
    token = _EXPERTS.set(_Experts(quant.recipe, quant.expert_key(getattr(self, "rngs", None)), axes))
    try:
      return original_sparse(self, *args, **kwargs)
    finally:
      _EXPERTS.reset(token)

  sparse_matmul.s3r_backend = True  # type: ignore[attr-defined]
  moe.RoutedMoE.sparse_matmul = sparse_matmul


def main(argv: Sequence[str] | None = None) -> None:
  """MaxText's pre-training entry point with s3r registered: `python -m s3r.integrations.maxtext
  base.yml quantization=s3r:s3r_ec_dx ...` takes exactly the arguments of `python -m
  maxtext.trainers.pre_train.train`."""
  register()
  from absl import app  # noqa: PLC0415
  from maxtext.trainers.pre_train import train  # noqa: PLC0415

  app.run(train.main, argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # run as a module: use the imported copy, the one MaxText's code will see
  importlib.import_module("s3r.integrations.maxtext").main()
