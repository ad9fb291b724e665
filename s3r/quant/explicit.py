"""Explicit mesh axes ("sharding in types"): the quantized matmuls run their internals with Auto axes.

Under a mesh with `jax.sharding.AxisType.Explicit` axes (`jax.make_mesh(..., axis_types=...)` and
`jax.set_mesh`), every array's type carries its sharding, and each reshape, reduction and dot must
be able to state the sharding of its result. The quantizer's internals are written for the SPMD
partitioner: the per-token scales reshaped to [T, 1], the tokens of x flattened into the GEMMs'
rows, the S3R-EC factors, the tensor-parallel slices. So each entry point (`qmatmul`,
`grouped_qmatmul`, the `s3r.nn` adapters) runs them inside `jax.sharding.auto_axes`: the inputs keep
their shardings (cast to Auto, no data moves), the partitioner places the internals as it does under
an Auto mesh (the same program, so the same numbers), and the result gets the sharding of the plain
product: x's leading dims as they are, the output features as w's, unless x already uses that mesh
axis. Autodiff gives the gradients the shardings of x and w. Under an Auto mesh, or none, nothing
changes.

Dimension letters: K input features, N outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from jax.sharding import PartitionSpec as P

Entry = str | tuple[str, ...] | None  # one dimension's entry of a PartitionSpec


def explicit_axes() -> bool:
  """Whether the trace runs under a mesh with at least one Explicit axis."""
  mesh = jax.sharding.get_abstract_mesh()
  return not mesh.empty and bool(mesh.explicit_axes)


def dims_spec(a: jax.Array) -> tuple[Entry, ...]:
  """The PartitionSpec entries of `a`'s typed sharding, one per dimension."""
  spec = tuple(jax.typeof(a).sharding.spec)
  return spec + (None,) * (a.ndim - len(spec))


def _names(entry: Entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def product_spec(lead: Sequence[Entry], tail: Sequence[Entry]) -> P:
  """`lead` then `tail`, every mesh axis used once: a tail entry naming an axis already used is dropped
  (the output features of x [..., K] @ w [K, N] stay whole where x's dims already use w's axis)."""
  used = {a for e in lead for a in _names(e)}
  out = list(lead)
  for entry in tail:
    names = _names(entry)
    if used.intersection(names):
      out.append(None)
    else:
      used.update(names)
      out.append(entry)
  return P(*out)


def matmul_spec(x: jax.Array, w: jax.Array) -> P:
  """The sharding of x [..., K] @ w [..., N]: x's leading dims, then w's last dim (see `product_spec`)."""
  return product_spec(dims_spec(x)[:-1], dims_spec(w)[-1:])


def dot_general_spec(lhs: jax.Array, rhs: jax.Array, dimension_numbers) -> P:
  """The sharding of `lax.dot_general(lhs, rhs, dimension_numbers)`: batch dims, lhs free, rhs free."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_spec, rhs_spec = dims_spec(lhs), dims_spec(rhs)
  lhs_free = [d for d in range(lhs.ndim) if d % lhs.ndim not in {c % lhs.ndim for c in (*lhs_contract, *lhs_batch)}]
  rhs_free = [d for d in range(rhs.ndim) if d % rhs.ndim not in {c % rhs.ndim for c in (*rhs_contract, *rhs_batch)}]
  lead = [lhs_spec[d] for d in lhs_batch] + [lhs_spec[d] for d in lhs_free]
  return product_spec(lead, [rhs_spec[d] for d in rhs_free])


def run_auto(fn: Callable[..., jax.Array], out_sharding, *args) -> jax.Array:
  """fn(*args) with the mesh's Explicit axes made Auto inside, the result resharded to `out_sharding`."""
  auto = jax.sharding.auto_axes(fn, out_sharding=out_sharding)
  return auto(*args)  # pyrefly: ignore[bad-return]
