"""Argument checks of the quantized matmuls (trace time; concrete group sizes eagerly).

`check` is the one entry point of `qmatmul`, `gradient_codes` and `grouped_qmatmul`: the recipe,
the operands' types, dtypes and shapes, and the key, each error naming the function and the
argument. The dense layer passes x [..., K] and w [K, N]; the grouped one x [T, K], w [E, K, N]
and group_sizes [E].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant.recipes import Recipe
from s3r.quant.recipes import recipe as get_recipe

_FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64)


def check(fn: str, recipe, key, x, w, group_sizes=None, *, key_required: bool) -> tuple[Recipe, jax.Array | None]:
  """(the Recipe, the key as a typed key or None) after checking every argument of `fn`.

  `group_sizes` is given for the grouped product only. The key is None when the recipe draws no
  random numbers, or, unless `key_required`, when none was given (forward-only use).
  """
  recipe = check_recipe(fn, recipe)
  arrays = (("x", x), ("w", w)) + ((("group_sizes", group_sizes),) if group_sizes is not None else ())
  for name, a in arrays:
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
      raise TypeError(f"{fn}: {name} must be an array, got {type(a).__name__}")
  for name, a in (("x", x), ("w", w)):
    if not any(a.dtype == f for f in _FLOATS):
      raise TypeError(f"{fn}: {name} must have a real floating dtype (bfloat16, float16, float32), got {describe(a)}")
  if group_sizes is None:
    _dense_shapes(fn, x, w)
  else:
    _grouped_shapes(fn, x, w, group_sizes)
  return recipe, _key(fn, key, recipe, required=key_required)


COMPUTE_DTYPES = ("bfloat16", "float32")  # operand dtypes of the unquantized (bf16) recipe's product


def compute_dtype(fn: str, dtype) -> np.dtype:
  """The operand dtype of the unquantized recipe's product: bfloat16 for None, else `dtype` (one of COMPUTE_DTYPES)."""
  if dtype is None:
    return np.dtype(jnp.bfloat16)
  try:
    resolved = np.dtype(jnp.dtype(dtype))
  except TypeError:
    resolved = None
  if resolved is None or resolved.name not in COMPUTE_DTYPES:
    raise ValueError(f"{fn}: compute_dtype must be one of {', '.join(COMPUTE_DTYPES)} or None, got {dtype!r}")
  return resolved


def float_precision(dtype: np.dtype):
  """The dot precision of an unquantized product in `dtype`: full f32 for float32 (no TF32), the default for bf16."""
  return jax.lax.Precision.HIGHEST if dtype == np.float32 else None


def describe(a) -> str:
  return f"shape {tuple(a.shape)} dtype {a.dtype}"


def check_recipe(fn: str, recipe) -> Recipe:
  """The Recipe `recipe` names (a Recipe passes through)."""
  if isinstance(recipe, (Recipe, str)):
    return get_recipe(recipe)
  raise TypeError(f"{fn}: recipe must be a s3r.Recipe or a recipe name (str), got {type(recipe).__name__}")


def _dense_shapes(fn: str, x, w) -> None:
  if x.ndim < 1:
    raise ValueError(f"{fn}: x must be [..., K] (at least one dim), got {describe(x)}")
  if w.ndim != 2:
    raise ValueError(f"{fn}: w must be [K, N], got {describe(w)}")
  if x.shape[-1] != w.shape[0]:
    raise ValueError(
      f"{fn}: the last dim of x ({x.shape[-1]}) must equal the first dim of w "
      f"({w.shape[0]}); x has {describe(x)}, w has {describe(w)}"
    )


def _grouped_shapes(fn: str, x, w, group_sizes) -> None:
  if x.ndim != 2:
    raise ValueError(f"{fn}: x must be [T, K] (rows sorted by expert), got {describe(x)}")
  if w.ndim != 3:
    raise ValueError(f"{fn}: w must be [E, K, N] (one [K, N] weight per expert), got {describe(w)}")
  if x.shape[1] != w.shape[1]:
    raise ValueError(
      f"{fn}: the last dim of x ({x.shape[1]}) must equal dim 1 of w ({w.shape[1]}); "
      f"x has {describe(x)}, w has {describe(w)}"
    )
  if group_sizes.dtype != jnp.int32:
    raise TypeError(f"{fn}: group_sizes must be int32, got {describe(group_sizes)}")
  if group_sizes.shape != (w.shape[0],):
    raise ValueError(
      f"{fn}: group_sizes must be [E] = [{w.shape[0]}] (one size per expert of w), got {describe(group_sizes)}"
    )
  if isinstance(group_sizes, jax.core.Tracer):
    return  # traced values cannot be checked (see grouped_qmatmul's docstring)
  sizes = np.asarray(group_sizes, np.int64)
  if (sizes < 0).any():
    raise ValueError(f"{fn}: group_sizes must be >= 0, got {sizes.tolist()}")
  if sizes.sum() > x.shape[0]:
    raise ValueError(f"{fn}: group_sizes sum to {int(sizes.sum())}, more than the {x.shape[0]} rows of x")


def _key(fn: str, key, recipe: Recipe, *, required: bool):
  """The key as a typed key; None when the recipe needs none (or, unless `required`, none was given)."""
  if not recipe.stochastic or (key is None and not required):
    return None
  if key is None:
    raise ValueError(f"{fn}: recipe {recipe.name!r} rounds stochastically and needs key=jax.random.key(...), got None")
  if not hasattr(key, "dtype"):
    raise TypeError(f"{fn}: key must be a jax.random.key array, got {type(key).__name__}")
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"{fn}: key must be a single key (shape ()), got shape {tuple(key.shape)}")
    return key
  if key.dtype == jnp.uint32 and key.shape == (2,):
    return jax.random.wrap_key_data(key)
  raise TypeError(f"{fn}: key must be a jax.random.key (or a raw uint32[2] key), got {describe(key)}")
