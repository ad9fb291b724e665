"""One walker over jaxprs: every equation of a program, however deeply nested, with how often it runs.

`iter_eqns(jaxpr)` yields every equation of a jaxpr and of the jaxprs nested in its equations'
parameters (jit, custom_vjp, scan, remat, cond, ...); `counted_eqns` pairs each with its
multiplicity (a scan body runs `length` times). On top: `int8_dots` lists the int8 x int8 -> int32
dot_generals (per quantized layer the forward, dX and dW GEMMs, plus S3R-EC's small
[3B + 1, N] x [K, N] correction product), `random_draws` the 32-bit random words drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import jax.numpy as jnp
from jax.core import ShapedArray
from jax.extend import core


def _sub_jaxprs(value: Any) -> Iterator[core.Jaxpr]:
  if isinstance(value, core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)


def counted_eqns(jaxpr: core.Jaxpr | core.ClosedJaxpr, times: int = 1) -> Iterator[tuple[core.JaxprEqn, int]]:
  """(equation, executions per run of `jaxpr`) for every equation, nested ones included."""
  if isinstance(jaxpr, core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  for eqn in jaxpr.eqns:
    yield eqn, times
    inner = times * (eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1)
    for param in eqn.params.values():
      for sub in _sub_jaxprs(param):
        yield from counted_eqns(sub, inner)


def iter_eqns(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> Iterator[core.JaxprEqn]:
  """Every equation of `jaxpr` (a Jaxpr or ClosedJaxpr) and of all jaxprs nested in it."""
  for eqn, _ in counted_eqns(jaxpr):
    yield eqn


def shaped(var: core.Var | core.Literal) -> ShapedArray:
  """The abstract value of an array variable (every operand and result of the primitives read here)."""
  return cast(ShapedArray, var.aval)


def is_int8_dot(eqn: core.JaxprEqn) -> bool:
  """An int8 x int8 dot_general accumulating in int32."""
  if eqn.primitive.name != "dot_general":
    return False
  lhs, rhs = (shaped(v) for v in eqn.invars)
  return lhs.dtype == jnp.int8 and rhs.dtype == jnp.int8 and eqn.params.get("preferred_element_type") == jnp.int32


def int8_dots(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> list[core.JaxprEqn]:
  """All int8 x int8 -> int32 dot_generals in `jaxpr`, nested ones included."""
  return [e for e in iter_eqns(jaxpr) if is_int8_dot(e)]


def random_draws(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> dict[str, Any]:
  """32-bit random words drawn per run of `jaxpr`: {'words', 'draws': [...], 'derived_keys'}.

  `random_bits` of shape s and width b draws ceil(prod(s) * b / 32) words; a raw `threefry2x32`
  call two words per output element; key derivations (`random_split`, `random_fold_in`) are
  counted separately as `derived_keys`. Scan bodies count `length` times.
  """
  words, keys, draws = 0, 0, []
  for eqn, times in counted_eqns(jaxpr):
    name = eqn.primitive.name
    if name == "random_bits":
      shape = tuple(eqn.params["shape"])
      n = math.ceil(math.prod(shape) * eqn.params["bit_width"] / 32) * times
      words += n
      draws.append({"primitive": name, "shape": list(shape), "bit_width": eqn.params["bit_width"], "words": n})
    elif name == "threefry2x32":
      shape = tuple(shaped(eqn.outvars[0]).shape)
      n = 2 * math.prod(shape) * times
      words += n
      draws.append({"primitive": name, "shape": list(shape), "words": n})
    elif name in ("random_split", "random_fold_in"):
      keys += math.prod(shaped(eqn.outvars[0]).shape) * times
  return {"words": words, "draws": draws, "derived_keys": keys}


def random_words(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> int:
  """Number of 32-bit random words drawn per run of `jaxpr` (see `random_draws`)."""
  return random_draws(jaxpr)["words"]
