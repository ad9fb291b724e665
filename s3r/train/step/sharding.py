"""The device mesh and the one table of partition rules.

The mesh has axes ("data", "expert", "fsdp", "tensor"). The model names the axes of its
parameters (`logical_axes` metadata) and of its activations (`s3r.model.constrain`) logically;
`RULES` below maps every logical name to mesh axes:
- batch over (data, expert, fsdp): data parallelism, with expert and FSDP ranks also taking a
  batch slice (outside the MoE feed-forward an expert rank is a data-parallel rank);
- the routed experts of every MoE layer over expert: expert parallelism (each rank holds
  E / expert experts of every MoE layer and their optimizer state; XLA's SPMD partitioner
  moves the expert-sorted rows and gradients between ranks, or, with the MoE config's
  expert_dispatch="all_to_all", an explicit all_to_all (s3r.model.moe_ep); see docs/moe.md);
- the model width of every matrix over fsdp: FSDP (parameters and optimizer state sharded,
  gathered per layer by XLA);
- attention heads, MLP hidden units and the vocabulary over tensor: Megatron-style tensor
  parallelism (q/k/v/gate/up column-parallel, o/down row-parallel).
A dimension that a mesh axis does not divide stays replicated along that axis.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from s3r import model as s3r_model

MESH_AXES = ("data", "expert", "fsdp", "tensor")

RULES: dict[str, str | tuple[str, ...] | None] = {
  # parameters
  "vocab": "tensor",  # embedding rows, logits columns
  "embed": "fsdp",  # model width D of every matrix
  "heads": "tensor",  # q columns, o rows
  "kv_heads": "tensor",  # k, v columns
  "mlp": "tensor",  # gate, up columns; down rows
  "expert": "expert",  # the routed-expert dimension E of the MoE expert weights [E, D, F] / [E, F, D]
  "norm": None,  # RMSNorm scales: replicated
  # activations
  "batch": ("data", "expert", "fsdp"),
  "seq": None,
  "act_embed": None,  # the residual stream is replicated over tensor
  "act_heads": "tensor",
  "act_kv_heads": "tensor",
  "act_mlp": "tensor",
  "act_vocab": "tensor",
}


def mesh_shape(spec: str | None) -> dict[str, int]:
  """'data=2,fsdp=2,tensor=2' -> {'data': 2, 'expert': 1, 'fsdp': 2, 'tensor': 2}; None or '' -> one device.

  Omitted axes have size 1. ValueError naming --mesh for an entry that is not AXIS=SIZE with a known
  axis and an integer size >= 1, and for an axis given twice.
  """
  shape = dict.fromkeys(MESH_AXES, 1)
  if not spec:
    return shape
  given: set[str] = set()
  for part in spec.split(","):
    name, sep, size = (s.strip() for s in part.partition("="))
    if not sep or not name:
      raise ValueError(f"--mesh {spec}: bad entry {part.strip()!r}; expected AXIS=SIZE, {_MESH_EXAMPLE}")
    if name not in MESH_AXES:
      raise ValueError(f"--mesh {spec}: unknown axis {name!r}; the axes are {', '.join(MESH_AXES)}")
    if not size.isdigit() or int(size) < 1:
      raise ValueError(f"--mesh {spec}: the size of {name} must be an integer >= 1, got {size!r}")
    if name in given:
      raise ValueError(f"--mesh {spec}: axis {name} is given twice; name each axis once, {_MESH_EXAMPLE}")
    given.add(name)
    shape[name] = int(size)
  return shape


_MESH_EXAMPLE = "e.g. data=2,fsdp=2,tensor=2 or expert=4,data=2"


def parse_mesh(spec: str | None, n_devices: int) -> dict[str, int]:
  """The axis sizes of `spec` (see `mesh_shape`); a given spec must use exactly `n_devices` devices."""
  shape = mesh_shape(spec)
  if spec and math.prod(shape.values()) != n_devices:
    raise ValueError(
      f"--mesh {spec}: {'x'.join(map(str, shape.values()))} = {math.prod(shape.values())} devices, "
      f"but {n_devices} are available; the sizes must multiply to {n_devices}"
    )
  return shape


def make_mesh(shape: dict[str, int]) -> Mesh:
  """A mesh over the first prod(shape) devices with axes MESH_AXES."""
  sizes = tuple(shape[a] for a in MESH_AXES)
  devices = np.asarray(jax.devices()[: math.prod(sizes)]).reshape(sizes)
  return Mesh(devices, MESH_AXES)


def mesh_spec(logical: P, shape: tuple[int, ...], mesh: Mesh | AbstractMesh) -> P:
  """Maps a PartitionSpec of logical names onto `mesh` through RULES (dropping axes that do not divide)."""
  used, out = set(), []
  for name, dim in zip(tuple(logical) + (None,) * (len(shape) - len(logical)), shape):
    axes = RULES[name] if name is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
    if axes and dim % math.prod(mesh.shape[a] for a in axes):
      axes = ()
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*out)


def sharding(mesh: Mesh, logical: P, shape: tuple[int, ...]) -> NamedSharding:
  return NamedSharding(mesh, mesh_spec(logical, shape, mesh))


def activation_constraint(mesh: Mesh):
  """The function `s3r.model.activation_sharding` applies to tagged activations."""
  return lambda x, axes: jax.lax.with_sharding_constraint(x, sharding(mesh, P(*axes), x.shape))


def with_activation_sharding(fn, mesh: Mesh):
  """`fn` traced with the model's activations constrained by RULES on `mesh`, and with `mesh`
  as the abstract mesh of the trace (`jax.sharding.get_abstract_mesh()`), which
  `s3r.quant.ec` uses to gather the S3R-EC factors instead of reducing weight-sized partials."""
  constraint = activation_constraint(mesh)

  def wrapped(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), s3r_model.activation_sharding(constraint):
      return fn(*args)

  return wrapped


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
  """Batches [B, S+1]: batch over (data, expert, fsdp)."""
  per_batch = mesh.shape["data"] * mesh.shape["expert"] * mesh.shape["fsdp"]
  if shape[0] % per_batch:
    raise ValueError(f"--batch {shape[0]} must be divisible by data x expert x fsdp = {per_batch} of the mesh")
  return sharding(mesh, P("batch", "seq"), shape)


def state_shardings(mesh: Mesh, cfg: s3r_model.ModelConfig, abstract_state, tx: optax.GradientTransformation):
  """NamedShardings for a TrainState: parameters and their optimizer moments by RULES, scalars replicated."""
  logical = s3r_model.logical_axes(cfg)
  params = jax.tree.map(lambda spec, p: sharding(mesh, spec, p.shape), logical, abstract_state.params)
  replicated = NamedSharding(mesh, P())
  opt_state = optax.tree_map_params(
    tx.init,
    lambda _, s: s,
    abstract_state.opt_state,
    params,
    transform_non_params=lambda _: replicated,
    is_leaf=lambda x: isinstance(x, NamedSharding),
  )
  return type(abstract_state)(step=replicated, params=params, opt_state=opt_state)
