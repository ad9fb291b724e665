"""`quantize_fn`: s3r for any JAX function, outside Flax (plain JAX, Equinox, hand-written models).

`quantize_fn(f, recipe, key=...)` returns a function with f's signature that traces f to a jaxpr
and runs that program with every *projection* through `s3r.qmatmul`: a `dot_general` with one
operand derived from a parameter and the other not. `jnp.matmul`, `@`, `jnp.einsum`, `jnp.dot` and
`lax.dot_general` all reach the program as that one primitive, so it does not matter how f (or a
library it calls) writes its products. Parameters are the array leaves of the arguments named by
`params` (argument positions; default the first, e.g. an Equinox model or a params dict), and an
operand is derived from one when only layout and dtype operations lie between them (casts,
reshapes, transposes, slices, broadcasts, stacking of parameters, a scan's slice of stacked
layers). A gather is not one, so an embedding lookup's rows are activations and the tied output
projection `x @ embed.T` is a projection. Products of two activations (attention scores and
weighted values) and of two parameters are left as written.

`Rule` chooses among the projections: `skip` (glob patterns over the parameter's path, e.g.
"lm_head", "blocks/*/attn/*") and a `predicate` over the `Site` (its parameter path and operand
shapes). A skip pattern that matches no projection is a ValueError listing them. `sites(f, ...)`
lists the projections f has, with their paths, shapes and whether the rule quantizes them.

Keys: call site i (the i-th projection of the program in trace order, nested bodies numbered
where they appear) gets `fold_in(key, i)`; inside `lax.scan` bodies, the iteration index t of
every enclosing scan is folded in after it, outermost first: `fold_in(fold_in(key, i), t)`. So
no two calls of one program share a key; a fresh `key` per step gives fresh thresholds. `key=None`
runs the forward (evaluation); a gradient through a stochastic recipe then raises, as qmatmul's.

Transformations: the program is re-run inside the caller's, so `jax.jit`, `jax.grad` (and Equinox's
`filter_jit`/`filter_grad`) and `jax.vmap` apply outside as they would to f. The bodies of `jax.jit`
(inlined), `lax.scan`, `jax.checkpoint` (kept, same policy) and `lax.cond`/`lax.switch` are
interpreted as well. Left as written: projections inside `lax.while_loop`/`fori_loop` with a
traced trip count, `shard_map`, functions with their own `custom_jvp`/`custom_vjp`, Pallas kernels
and callbacks. A `jax.vmap` inside f is already applied in the program, so the projection of a
per-example model mapped over a batch is one batched qmatmul with the mapped axes among x's
leading axes in the order the product lists them (Equinox's `jax.vmap(model)(x_BxSxK)` gives
x [B, S, K]: B examples of S tokens). A vmap outside the quantized function maps qmatmul itself
(see s3r/quant/vmapped.py).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from s3r.nn.dot_general import _quantized_dot
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe
from s3r.quant.recipes import recipe as get_recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class Site:
  """One projection of the traced program: a dot_general of a parameter with an activation."""

  index: int  # call-site number (its key is fold_in(key, index)), in trace order
  param: str  # path of the parameter leaf in the params argument, "/"-joined ("blocks/0/mlp/weight")
  weight_shape: tuple[int, ...]  # the parameter operand's shape as the product receives it
  activation_shape: tuple[int, ...]  # the other operand's shape
  quantized: bool  # whether the rule sends it through qmatmul


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
  """Which projections are quantized: all but those whose parameter path matches a `skip` pattern
  (fnmatch, against the path or any leading part of it: "lm_head" matches "lm_head/weight") or for
  which `predicate(site)` is False."""

  skip: tuple[str, ...] = ()
  predicate: Callable[[Site], bool] | None = None

  def __post_init__(self):
    if isinstance(self.skip, str) or not all(isinstance(p, str) for p in self.skip):
      raise TypeError(f"Rule.skip must be a tuple of glob patterns (str), got {self.skip!r}")
    if self.predicate is not None and not callable(self.predicate):
      raise TypeError(f"Rule.predicate must be callable (Site -> bool) or None, got {self.predicate!r}")

  def skipped(self, param: str) -> bool:
    return any(_path_matches(param, p) for p in self.skip)

  def selects(self, site: Site) -> bool:
    return not self.skipped(site.param) and (self.predicate is None or bool(self.predicate(site)))


def _path_matches(path: str, pattern: str) -> bool:
  parts = path.split("/")
  return any(fnmatch.fnmatchcase("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1))


def quantize_fn(
  f: Callable,
  recipe: str | Recipe = DEFAULT_RECIPE,
  *,
  key: jax.Array | None = None,
  params: int | Sequence[int] = 0,
  rule: Rule | None = None,
) -> Callable:
  """f with every projection (see the module doc) run by `s3r.qmatmul` with `recipe`.

  Args:
    f: any JAX-traceable function; its array arguments and results are as f's.
    recipe: a `Recipe` or a registered name.
    key: a `jax.random.key` for the backward's rounding, fresh per step (None: forward only).
    params: position(s) of f's arguments whose array leaves are parameters.
    rule: which projections to quantize (default: all).
  """
  run = _runner(f, get_recipe(recipe), params, rule or Rule())

  @functools.wraps(f)
  def quantized(*args, **kwargs):
    return run(key, args, kwargs)[0]

  return quantized


def sites(
  f: Callable, *args, recipe: str | Recipe = DEFAULT_RECIPE, params: int | Sequence[int] = 0, rule=None, **kwargs
) -> list[Site]:
  """The projections of f on these arguments (traced abstractly, nothing runs), in call-site order."""
  return _runner(f, get_recipe(recipe), params, rule or Rule())(None, args, kwargs, abstract=True)[1]


def _runner(f: Callable, recipe: Recipe, params, rule: Rule):
  argnums = (params,) if isinstance(params, int) else tuple(params)

  def run(key, args, kwargs, abstract=False):
    flat, treedef = jax.tree_util.tree_flatten_with_path((tuple(args), kwargs))
    dynamic = [i for i, (_, leaf) in enumerate(flat) if isinstance(leaf, (jax.Array, np.ndarray, np.generic))]
    leaves = [leaf for _, leaf in flat]

    def flat_f(*values):
      merged = list(leaves)
      for i, v in zip(dynamic, values):
        merged[i] = v
      a, kw = jax.tree_util.tree_unflatten(treedef, merged)
      return f(*a, **kw)

    values = [leaves[i] for i in dynamic]
    closed, out_shape = jax.make_jaxpr(flat_f, return_shape=True)(*values)
    tags = [_param_tag(flat[i][0], leaves[i], argnums) for i in dynamic]
    interpreter = _Interpreter(recipe, rule, _typed(key))
    program = lambda values: interpreter.run(closed.jaxpr, closed.consts, values, tags, ())[0]
    outs = jax.eval_shape(program, values) if abstract else program(values)
    _check_skip(rule, interpreter.sites)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs), interpreter.sites

  return run


def _typed(key):
  if key is not None and not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(key)  # a raw uint32[2] key; qmatmul checks the rest
  return key


def _param_tag(path, leaf, argnums) -> str | None:
  """The "/"-joined path of a floating leaf of a params argument, else None."""
  (_, position, *rest) = path  # (args or kwargs, argument, path inside it)
  if path[0].idx != 0 or position.idx not in argnums or not jnp.issubdtype(leaf.dtype, jnp.floating):
    return None
  return "/".join(_key_name(k) for k in rest)


def _key_name(k) -> str:
  for attr in ("name", "key", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _check_skip(rule: Rule, found: list[Site]) -> None:
  paths = list(dict.fromkeys(s.param for s in found))
  unmatched = [p for p in rule.skip if not any(_path_matches(path, p) for path in paths)]
  if unmatched:
    raise ValueError(
      f"quantize_fn: skip pattern(s) {', '.join(map(repr, unmatched))} match no projection's parameter; "
      f"the projections' parameters are: {', '.join(paths) or 'none'}"
    )


# Primitives whose result is its first operand's data rearranged or cast: a parameter stays one.
_LAYOUT = frozenset(
  "convert_element_type reshape transpose squeeze expand_dims broadcast_in_dim copy copy_p slice "
  "dynamic_slice rev reduce_precision sharding_constraint mesh_cast reshard".split()
)
_JOINS = frozenset(("concatenate", "stack"))  # a parameter when every operand is one


class _Interpreter:
  """Runs a jaxpr, sending each selected projection through qmatmul; collects the sites."""

  def __init__(self, recipe: Recipe, rule: Rule, key):
    self.recipe, self.rule, self.key = recipe, rule, key
    self.sites: list[Site] = []

  def run(self, jaxpr: core.Jaxpr, consts, args, tags, loops) -> tuple[list, list]:
    env: dict[Any, tuple[Any, str | None]] = {}

    def read(v):
      return (v.val, None) if isinstance(v, core.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
      env[v] = (c, None)
    for v, a, t in zip(jaxpr.invars, args, tags):
      env[v] = (a, t)
    for eqn in jaxpr.eqns:
      invals, intags = zip(*map(read, eqn.invars)) if eqn.invars else ((), ())
      outs, out_tags = self.eqn(eqn, list(invals), list(intags), loops)
      for v, o, t in zip(eqn.outvars, outs, out_tags):
        env[v] = (o, t)
    results = [read(v) for v in jaxpr.outvars]
    return [r[0] for r in results], [r[1] for r in results]

  def eqn(self, eqn, invals, intags, loops):
    name = eqn.primitive.name
    if name == "dot_general":
      out = self.dot(eqn, invals, intags, loops)
      return [out], [None]
    if name in ("jit", "pjit", "closed_call"):
      inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
      return self.run(inner.jaxpr, inner.consts, invals, intags, loops)
    if name == "scan":
      return self.scan(eqn, invals, intags, loops), [None] * len(eqn.outvars)
    if name in ("remat2", "checkpoint"):
      p = eqn.params
      body = lambda *a: self.run(p["jaxpr"], (), a, intags, loops)[0]
      outs = jax.checkpoint(body, prevent_cse=p["prevent_cse"], policy=p["policy"])(*invals)
      return list(outs), [None] * len(eqn.outvars)
    if name == "cond":
      branches = [self.branch(b, intags[1:], loops) for b in eqn.params["branches"]]
      return list(jax.lax.switch(invals[0], branches, *invals[1:])), [None] * len(eqn.outvars)
    outs = _bind(eqn, invals)
    if name in _LAYOUT:
      return outs, [intags[0]]
    joined = intags[0] if name in _JOINS and all(t is not None for t in intags) else None
    return outs, [joined] * len(outs)

  def branch(self, closed, tags, loops):
    return lambda *ops: self.run(closed.jaxpr, closed.consts, ops, tags, loops)[0]

  def scan(self, eqn, invals, intags, loops):
    p = eqn.params
    n_consts, n_carry = _scan_counts(p)
    consts, init, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    body_tags = intags[:n_consts] + [None] * n_carry + intags[n_consts + n_carry :]
    body = p["jaxpr"]

    def step(carry, inputs):
      t, xs_t = inputs
      outs = self.run(body.jaxpr, body.consts, [*consts, *carry, *xs_t], body_tags, (*loops, t))[0]
      return outs[:n_carry], outs[n_carry:]

    steps = jnp.arange(p["length"], dtype=jnp.uint32)
    carry, ys = jax.lax.scan(step, init, (steps, xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"])
    return [*carry, *ys]

  def dot(self, eqn, invals, intags, loops):
    lhs, rhs = invals
    param_lhs = intags[0] is not None
    floating = all(jnp.issubdtype(a.dtype, jnp.floating) for a in (lhs, rhs))
    if param_lhs == (intags[1] is not None) or not floating:  # two activations, two parameters, or integers
      return _bind(eqn, invals)[0]
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    act, weight, dims = (rhs, lhs, ((rc, lc), (rb, lb))) if param_lhs else (lhs, rhs, ((lc, rc), (lb, rb)))
    path = intags[0] if param_lhs else intags[1]
    site = Site(
      index=len(self.sites),
      param=path,
      weight_shape=tuple(weight.shape),
      activation_shape=tuple(act.shape),
      quantized=False,
    )
    site = dataclasses.replace(site, quantized=self.rule.selects(site))
    self.sites.append(site)
    if not site.quantized:
      return _bind(eqn, invals)[0]
    key = None
    if self.key is not None and self.recipe.stochastic:
      key = jax.random.fold_in(self.key, site.index)
      for t in loops:
        key = jax.random.fold_in(key, t)
    out_sharding = eqn.params.get("out_sharding")
    y = _quantized_dot(act, weight, dims, key=key, recipe=self.recipe, out_sharding=out_sharding)
    if param_lhs:  # dot_general's order is (batch, lhs free, rhs free): put the weight's free dims first
      n_batch, n_act = len(lb), act.ndim - len(rc) - len(rb)
      order = list(range(n_batch)) + list(range(n_batch + n_act, y.ndim)) + list(range(n_batch, n_batch + n_act))
      y = jnp.transpose(y, order)
    return y.astype(eqn.outvars[0].aval.dtype)


def _bind(eqn, invals) -> list:
  params = eqn.primitive.get_bind_params(eqn.params)
  with eqn.ctx.manager:  # the equation's context (e.g. compute_on), as jax's own evaluator does
    out = eqn.primitive.bind(*invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def _scan_counts(params) -> tuple[int, int]:
  """(consts, carry) leaf counts of a scan equation (its `ft_in` groups consts, carry and xs)."""
  if "num_consts" in params:
    return params["num_consts"], params["num_carry"]
  consts, carry, _ = params["ft_in"].unpack()
  return len(consts), len(carry)
