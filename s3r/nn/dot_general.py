"""`dot_general` adapters: drop s3r's quantized matmul into Flax `Dense` / `nnx.Linear`.

Flax layers call `dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), ...)`.
These adapters accept exactly that contraction (the last dim of the input with the first
dim of a 2-D kernel) and route it through `s3r.qmatmul`. Inputs of rank > 3 are flattened
to [examples, tokens, K]: every leading dim but the last two counts as an example dim.

Key plumbing (stochastic recipes need a fresh key per layer and step):
- `dot_general(recipe, key)`: a pure function with the key you give it; build it where the
  key is known (e.g. inside your model's `__call__`).
- `LinenDotGeneral` (Linen module): draws its key from the `"quant"` RNG stream, so pass
  `rngs={"quant": step_key}` to `apply`. Use it as `nn.Dense(..., dot_general_cls=
  functools.partial(LinenDotGeneral, recipe="s3r_ec_dx"))` or `dot_general=LinenDotGeneral(...)`.
- `NnxDotGeneral` (NNX module): owns an `nnx.Rngs` stream and draws a new key on every call;
  its RNG state is part of the model state, so `nnx.jit` advances it between steps.
"""

from __future__ import annotations

import math

import flax.linen as linen
import jax
from flax import nnx

from s3r.quant.matmul import qmatmul
from s3r.quant.recipes import Recipe, recipe as lookup_recipe


def _quantized_dot(lhs, rhs, dimension_numbers, *, key, recipe, tp=None, tp_axis="tensor"):
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  if (tuple(lhs_contract), tuple(rhs_contract)) != ((lhs.ndim - 1,), (0,)) or lhs_batch or rhs_batch or rhs.ndim != 2:
    raise NotImplementedError(
        "s3r dot_general supports only the Dense contraction (last dim of lhs with dim 0 of a 2-D rhs, no batch "
        f"dims); got dimension_numbers={dimension_numbers} for lhs {tuple(lhs.shape)}, rhs {tuple(rhs.shape)}")
  if lhs.ndim <= 3:
    return qmatmul(lhs, rhs, key=key, recipe=recipe, tp=tp, tp_axis=tp_axis)
  lead = lhs.shape[:-2]
  x = lhs.reshape(math.prod(lead), *lhs.shape[-2:])
  return qmatmul(x, rhs, key=key, recipe=recipe, tp=tp, tp_axis=tp_axis).reshape(*lead, lhs.shape[-2], rhs.shape[1])


def dot_general(recipe: str | Recipe, key: jax.Array | None, *, tp: str | None = None, tp_axis: str = "tensor"):
  """A `lax.dot_general`-compatible function that runs `s3r.qmatmul` with this key and recipe.

  `tp` ("row" or "column") and `tp_axis` describe the kernel's tensor-parallel split, as in
  `s3r.qmatmul`: under a mesh with that axis, partial sums are rounded per shard.
  """
  r = lookup_recipe(recipe)

  def fn(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **unused):
    del precision, preferred_element_type, unused  # the recipe fixes the numerics; output has lhs's dtype
    return _quantized_dot(lhs, rhs, dimension_numbers, key=key, recipe=r, tp=tp, tp_axis=tp_axis)

  return fn


class LinenDotGeneral(linen.Module):
  """Linen `dot_general` that quantizes with `recipe`, keyed from the `rng_collection` stream."""

  recipe: str | Recipe = "s3r_ec_dx"  # recipe name or Recipe
  rng_collection: str = "quant"  # RNG stream to draw the backward-pass key from
  tp: str | None = None  # tensor-parallel split of the kernel: "row", "column" or None (see s3r.qmatmul)
  tp_axis: str = "tensor"  # mesh axis of that split

  @linen.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **unused):
    r = lookup_recipe(self.recipe)
    key = self.make_rng(self.rng_collection) if r.stochastic else None
    return dot_general(r, key, tp=self.tp, tp_axis=self.tp_axis)(lhs, rhs, dimension_numbers)


class NnxDotGeneral(nnx.Module):
  """NNX `dot_general` that quantizes with `recipe` and draws a fresh key per call from `rngs`."""

  def __init__(self, recipe: str | Recipe = "s3r_ec_dx", *, rngs: nnx.Rngs, stream: str = "quant",
               tp: str | None = None, tp_axis: str = "tensor"):
    self.recipe = lookup_recipe(recipe)
    self.stream = stream
    self.tp, self.tp_axis = tp, tp_axis  # tensor-parallel split of the kernel (see s3r.qmatmul)
    self.rngs = rngs.fork() if hasattr(rngs, "fork") else rngs

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **unused):
    key = getattr(self.rngs, self.stream)() if self.recipe.stochastic else None
    return dot_general(self.recipe, key, tp=self.tp, tp_axis=self.tp_axis)(lhs, rhs, dimension_numbers)
