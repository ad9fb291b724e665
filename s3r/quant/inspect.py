"""Look inside traced and compiled programs: is a model really running INT8 GEMMs?

`int8_dots(jaxpr)` lists every int8 x int8 -> int32 dot_general of a program, however deeply
nested (jit, custom_vjp, scan, remat, cond): per quantized layer, the three GEMMs (forward, dX,
dW) and, for recipes that correct dX (S3R-EC), one small [3B + 1, N] x [K, N] product of the
rounding error's channel-mean digits with Ŵ (`ec.dx_correction`); `random_words(jaxpr)`
counts the 32-bit random words it draws; `full_size_buffers(hlo_text, n)` lists the top-level
buffers of a compiled program that hold n elements (what XLA materializes in memory, outside
fusions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax.extend import core


def _sub_jaxprs(value) -> Iterator[core.Jaxpr]:
  if isinstance(value, core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)


def iter_eqns(jaxpr) -> Iterator[core.JaxprEqn]:
  """Every equation of `jaxpr` (a Jaxpr or ClosedJaxpr) and of all jaxprs nested in it."""
  if isinstance(jaxpr, core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in _sub_jaxprs(param):
        yield from iter_eqns(sub)


def is_int8_dot(eqn) -> bool:
  """An int8 x int8 dot_general accumulating in int32."""
  if eqn.primitive.name != "dot_general":
    return False
  lhs, rhs = (v.aval for v in eqn.invars)
  return lhs.dtype == jnp.int8 and rhs.dtype == jnp.int8 and eqn.params.get("preferred_element_type") == jnp.int32


def int8_dots(jaxpr) -> list[core.JaxprEqn]:
  """All int8 x int8 -> int32 dot_generals in `jaxpr`, nested ones included."""
  return [e for e in iter_eqns(jaxpr) if is_int8_dot(e)]


def random_words(jaxpr) -> int:
  """Number of 32-bit random words drawn by `jaxpr` (random_bits equations)."""
  total = 0
  for eqn in iter_eqns(jaxpr):
    if eqn.primitive.name == "random_bits":
      total += math.prod(eqn.params["shape"]) * eqn.params["bit_width"] // 32
  return total


_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]\S* (\S+?)\(")


def full_size_buffers(hlo_text: str, num_elements: int) -> list[tuple[str, str, str]]:
  """(name, element type, opcode) of the entry computation's instructions with that many elements.

  These are the arrays XLA writes to memory; anything computed inside a fusion is not
  listed. Parameters are excluded.
  """
  entry = hlo_text[hlo_text.index("\nENTRY"):]
  entry = entry[: entry.index("\n}")]
  found = []
  for line in entry.splitlines():
    m = _INSTR.match(line)
    if not m or m.group(4) == "parameter":
      continue
    dims = [int(d) for d in m.group(3).split(",") if d]
    if math.prod(dims) == num_elements and dims:
      found.append((m.group(1), m.group(2), m.group(4)))
  return found


def compiled_text(fn, *args) -> str:
  """Optimized HLO text of `jax.jit(fn)` for these arguments."""
  return jax.jit(fn).lower(*args).compile().as_text()
