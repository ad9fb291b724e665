"""`quantize(model, recipe=...)`: put every projection of an existing Flax model through s3r.

- NNX (`nnx.Module`): replaces, in place, the `dot_general` of every `nnx.Linear` and
  `nnx.LinearGeneral` and the `einsum_op` of every `nnx.Einsum` whose path does not match
  `skip`, and returns the model. Each replaced layer gets its own key stream, seeded from
  `rngs`' `"quant"` stream (an int seed or an `nnx.Rngs`); stacked layers (made by `nnx.vmap`,
  so their kernel has extra leading dims) get one stream per layer. The `params` stream is
  never used, so the model's parameters stay exactly as they were.
- Linen (`linen.Module`): returns a `QuantizedLinen` whose `init`/`apply` run the module with
  a method interceptor that gives every `nn.Dense` and `nn.DenseGeneral` not matching `skip`
  the quantized `dot_general` (keyed from the `"quant"` RNG stream of `apply`, one key per layer
  and call, with the kernel's fingerprint folded in as in `LinenDotGeneral`, so scanned layers
  differ even when `nn.scan` broadcasts that stream; forward-only calls need no stream). Linen's
  `nn.Einsum` has no `dot_general` hook and stays unquantized. `QuantizedLinen.intercept()` is
  the bare context manager, for training loops that call `module.apply` themselves.

`skip`: names or glob patterns (`fnmatch`), matched against a layer's name and its path joined
with "/" (e.g. "lm_head", "router", "*/embed*", "layers/*/attn/out"). A pattern that matches no
projection layer is a ValueError that lists the layers (a typo would otherwise quantize the layer
it meant to keep): NNX checks when `quantize` is called; Linen, whose layers exist only while the
module runs, when the first `init`/`apply` (or `intercept()` block) that ran them returns.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable
from typing import Any, overload

import flax.linen as linen
import jax
from flax import nnx

from s3r.nn.dot_general import NnxDotGeneral, _quantized_dot, check_keys, dot_general
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe
from s3r.quant.recipes import recipe as get_recipe

_LINEN_TYPES = (linen.Dense, linen.DenseGeneral)
_NNX_TYPES = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum)


def _matches(path: Iterable, pattern: str) -> bool:
  parts = [str(p) for p in path]
  return fnmatch.fnmatchcase("/".join(parts), pattern) or bool(parts and fnmatch.fnmatchcase(parts[-1], pattern))


def _skipped(path: Iterable, skip: tuple[str, ...]) -> bool:
  return any(_matches(path, pat) for pat in skip)


_LISTED_LAYERS = 16  # layer paths an unmatched-skip error lists before "and N more"


def check_skip(skip: tuple[str, ...], layer_paths: Iterable[Iterable], kinds: str) -> None:
  """ValueError naming every pattern of `skip` that matches none of `layer_paths` (the projection layers
  `quantize` would replace, of `kinds`), and listing those layers: a typo must not quantize a layer it meant."""
  paths = ["/".join(map(str, p)) for p in layer_paths]
  unmatched = [pat for pat in skip if not any(_matches(p.split("/"), pat) for p in paths)]
  if not unmatched:
    return
  shown = ", ".join(paths[:_LISTED_LAYERS]) or "none"
  more = f", and {len(paths) - _LISTED_LAYERS} more" if len(paths) > _LISTED_LAYERS else ""
  raise ValueError(
    f"quantize: skip pattern(s) {', '.join(map(repr, unmatched))} match no {kinds} layer of the model "
    f"(patterns match a layer's name or its whole path joined with '/'); its {len(paths)} layers are: {shown}{more}"
  )


@overload
def quantize(
  model: linen.Module,
  recipe: str | Recipe = ...,
  *,
  skip: Iterable[str] = ...,
  rngs: nnx.Rngs | int = ...,
  stream: str = ...,
) -> QuantizedLinen: ...


@overload
def quantize[M: nnx.Module](
  model: M,
  recipe: str | Recipe = ...,
  *,
  skip: Iterable[str] = ...,
  rngs: nnx.Rngs | int = ...,
  stream: str = ...,
) -> M: ...


def quantize(
  model,
  recipe: str | Recipe = DEFAULT_RECIPE,
  *,
  skip: Iterable[str] = (),
  rngs: nnx.Rngs | int = 0,
  stream: str = "quant",
):
  """Quantize every Dense/DenseGeneral/Linear/LinearGeneral/Einsum projection of `model` with `recipe`.

  NNX models are changed in place and returned; Linen modules are wrapped (see the module doc).
  `rngs` (NNX only): an `nnx.Rngs` with a `stream` stream or an int seed for one.
  """
  recipe = get_recipe(recipe)
  skip = (skip,) if isinstance(skip, str) else tuple(skip)
  if isinstance(model, linen.Module):
    return QuantizedLinen(model, recipe, skip=skip, stream=stream)
  if isinstance(model, nnx.Module):
    return _quantize_nnx(model, recipe, skip, nnx.Rngs(**{stream: rngs}) if isinstance(rngs, int) else rngs, stream)
  raise TypeError(f"quantize: model must be a flax.linen.Module or a flax.nnx.Module, got {type(model).__name__}")


# --- NNX ---------------------------------------------------------------------------------------


def _stack(module: nnx.Linear | nnx.LinearGeneral | nnx.Einsum) -> tuple[int, ...]:
  """Leading kernel dims beyond the layer's own: the layer stack of an `nnx.vmap`-built model."""
  if isinstance(module, nnx.Einsum):
    own = len(module.kernel_shape)
  elif isinstance(module, nnx.LinearGeneral):
    own = len(module.batch_axis) + len(module.in_features) + len(module.out_features)
  else:
    own = 2
  shape = module.kernel.shape
  return tuple(shape[: len(shape) - own])


def _quantize_nnx[M: nnx.Module](model: M, recipe: Recipe, skip: tuple[str, ...], rngs: nnx.Rngs, stream: str) -> M:
  layers = [(path, m) for path, m in nnx.iter_modules(model) if isinstance(m, _NNX_TYPES)]
  check_skip(skip, [path for path, _ in layers], "Linear/LinearGeneral/Einsum")
  targets = [(path, m) for path, m in layers if not _skipped(path, skip)]
  for _, m in targets:  # nnx.data: the layers hold lax.dot_general / jnp.einsum as static attributes
    if isinstance(m, nnx.Einsum):
      m.einsum_op = nnx.data(NnxEinsumOp(recipe, rngs=rngs, stream=stream, stack=_stack(m)))
    else:
      m.dot_general = nnx.data(NnxDotGeneral(recipe, rngs=rngs, stream=stream, stack=_stack(m)))
      if isinstance(m, nnx.LinearGeneral):
        m.dot_general_cls = None
  check_keys(model)
  return model


def einsum(
  equation: str,
  lhs: jax.Array,
  rhs: jax.Array,
  dot: Callable[[jax.Array, jax.Array, jax.lax.DotDimensionNumbers], jax.Array],
) -> jax.Array:
  """The two-operand einsum `equation` (explicit "->", no ellipsis) as one `dot` (a dot_general) of
  lhs (activations) with rhs (weight), then a transpose to the output order."""
  inputs, out = equation.replace(" ", "").split("->")
  a, b = inputs.split(",")
  if "." in equation or len(set(a)) != len(a) or len(set(b)) != len(b) or not set(out) <= set(a) | set(b):
    raise NotImplementedError(f"s3r einsum: {equation!r} is not a projection (ellipsis, repeated or unknown index)")
  batch = [c for c in a if c in b and c in out]
  contract = [c for c in a if c in b and c not in out]
  summed = [c for c in a + b if c not in out and (c not in a or c not in b)]
  if summed:
    raise NotImplementedError(f"s3r einsum: {equation!r} sums indices {summed} of one operand only")
  dims = (
    (tuple(a.index(c) for c in contract), tuple(b.index(c) for c in contract)),
    (tuple(a.index(c) for c in batch), tuple(b.index(c) for c in batch)),
  )
  y = dot(lhs, rhs, dims)
  order = batch + [c for c in a if c not in b] + [c for c in b if c not in a]  # dot_general's output order
  perm = [order.index(c) for c in out]
  return y if perm == list(range(len(perm))) else y.transpose(perm)


class NnxEinsumOp(NnxDotGeneral):
  """`nnx.Einsum`'s `einsum_op` through s3r: `(equation, inputs, kernel, ...)` as a quantized dot_general."""

  def __call__(self, equation, lhs, rhs, precision=None, preferred_element_type=None, **unused):
    def dot(a, b, dims):
      y = _quantized_dot(a, b, dims, key=self.next_key(), recipe=self.recipe, tp=self.tp, tp_axis=self.tp_axis)
      return y if preferred_element_type is None else y.astype(preferred_element_type)

    return einsum(equation, lhs, rhs, dot)


# --- Linen -------------------------------------------------------------------------------------


class QuantizedLinen:
  """A Linen module run with s3r projections: `init` and `apply` as the module's (same variables)."""

  def __init__(self, module: linen.Module, recipe: Recipe, *, skip: tuple[str, ...] = (), stream: str = "quant"):
    self.module, self.recipe, self.skip, self.stream = module, recipe, skip, stream
    self._layers: dict[tuple[str, ...], None] = {}  # Dense/DenseGeneral paths seen while tracing, in order
    self._skip_checked = not skip  # every skip pattern has matched a layer seen
    self._depth = 0  # nesting of `intercept()`

  def _interceptor(self, next_fun, args, kwargs, context):
    m = context.module
    if context.method_name != "__call__" or not isinstance(m, _LINEN_TYPES):
      return next_fun(*args, **kwargs)
    self._layers.setdefault(tuple(map(str, m.path)), None)
    if _skipped(m.path, self.skip):
      return next_fun(*args, **kwargs)
    use_key = self.recipe.stochastic and m.has_rng(self.stream)
    fn = dot_general(self.recipe, m.make_rng(self.stream) if use_key else None, fold_kernel=True)
    saved = (m.dot_general, m.dot_general_cls)
    # Linen modules are frozen dataclasses: swap the dot_general for this one call, then restore it.
    object.__setattr__(m, "dot_general", fn)
    object.__setattr__(m, "dot_general_cls", None)
    try:
      return next_fun(*args, **kwargs)
    finally:
      object.__setattr__(m, "dot_general", saved[0])
      object.__setattr__(m, "dot_general_cls", saved[1])

  @contextlib.contextmanager
  def intercept(self):
    """Inside this context every `module.apply`/`init` (of any Linen module) uses s3r projections. Leaving
    it after the first trace that ran the model's layers, a `skip` pattern that matched none of them raises
    a ValueError listing them (`check_skip`)."""
    self._depth += 1
    try:
      with linen.intercept_methods(self._interceptor):
        yield
    finally:
      self._depth -= 1
    if self._depth == 0 and not self._skip_checked and self._layers:
      check_skip(self.skip, list(self._layers), "Dense/DenseGeneral")
      self._skip_checked = True

  def init(self, *args, **kwargs) -> Any:
    with self.intercept():
      return self.module.init(*args, **kwargs)

  def apply(self, *args, **kwargs) -> Any:
    """As `module.apply`; pass `rngs={"quant": step_key}` when a gradient is taken (stochastic recipes)."""
    with self.intercept():
      return self.module.apply(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self.module, name)
