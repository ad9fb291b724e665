"""`GroupedLinear`: an NNX layer of E expert weights applied to expert-sorted rows (MoE experts).

It wraps `s3r.grouped_qmatmul` with the key handling of `NnxDotGeneral`: the layer owns a
stream forked from the `rngs` it was built with and draws a fresh key on every call, so
`nnx.jit` advances it between steps. Parameters are f32 master weights [E, K, N] carrying
`logical_axes` metadata (the "expert" axis first).

Dimension letters: T rows (sorted by expert), E experts, K input features, N outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from s3r.quant.grouped import grouped_qmatmul
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe
from s3r.quant.recipes import recipe as get_recipe


class GroupedLinear(nnx.Module):
  """y[t] = x[t] @ kernel[e(t)] for rows sorted by expert, with the recipe's INT8 numerics."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    n_experts: int,
    *,
    recipe: str | Recipe = DEFAULT_RECIPE,
    rngs: nnx.Rngs,
    stream: str = "quant",
    init_std: float = 0.02,
    impl: str | None = None,
    logical_axes: tuple = ("expert", "embed", "mlp"),
  ):
    self.recipe = get_recipe(recipe)
    self.stream = stream
    self.impl = impl  # grouped GEMM implementation (see s3r.grouped_qmatmul); None picks the default
    self.kernel = nnx.Param(
      init_std * jax.random.normal(rngs.params(), (n_experts, in_features, out_features), jnp.float32),
      logical_axes=logical_axes,
    )
    self.rngs = rngs.fork() if hasattr(rngs, "fork") else rngs

  def __call__(self, x_TxK: jax.Array, group_sizes: jax.Array) -> jax.Array:
    key = getattr(self.rngs, self.stream)() if self.recipe.stochastic else None
    return grouped_qmatmul(x_TxK, self.kernel[...], group_sizes, key=key, recipe=self.recipe, impl=self.impl)
