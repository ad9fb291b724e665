"""The explicit way into s3r for an Equinox model: each `eqx.nn.Linear` replaced by a layer that calls
`s3r.qmatmul` itself (tree surgery, a key per layer). `python -m benchmarks eqx` times it against
`s3r.nn.quantize_fn`; tests/nn/test_equinox.py checks that both give the same gradients."""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax

import s3r


class QLinear(eqx.Module):
  """An eqx.nn.Linear's weights through s3r.qmatmul with a key of its own."""

  weight: jax.Array
  bias: jax.Array | None
  key: jax.Array
  recipe: str = eqx.field(static=True)

  def __call__(self, x):
    y = s3r.qmatmul(x, self.weight.T, key=self.key, recipe=self.recipe)
    return y if self.bias is None else y + self.bias


def linears(model) -> list[tuple[tuple, eqx.nn.Linear]]:
  """(path, layer) of every `eqx.nn.Linear` in `model`, in leaf order."""
  leaves = jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda n: isinstance(n, eqx.nn.Linear))[0]
  return [(path, leaf) for path, leaf in leaves if isinstance(leaf, eqx.nn.Linear)]


def with_qmatmul(model, key: jax.Array, recipe: str, index: Callable[[tuple], int] | None = None):
  """`model` with each Linear replaced by a `QLinear` keyed `fold_in(key, i)`: i is the layer's position
  in leaf order, or `index(path)` (the test keys them as quantize_fn keys its call sites)."""
  for i, (path, lin) in enumerate(linears(model)):
    k = jax.random.fold_in(key, i if index is None else index(path))
    q = QLinear(weight=lin.weight, bias=lin.bias, key=k, recipe=recipe)
    model = eqx.tree_at(lambda m, path=path: _at(m, path), model, q)
  return model


def _at(tree, path):
  for k in path:
    tree = tree[k.idx] if hasattr(k, "idx") else getattr(tree, k.name)
  return tree
