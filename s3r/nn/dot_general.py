"""`dot_general` adapters: drop s3r's quantized matmul into Flax layers.

Any `lax.dot_general(lhs, rhs, ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)))` whose
lhs is the activation and rhs the weight runs as `s3r.qmatmul` after flattening: the contracting
dims of lhs (in the order given) and of rhs (in the matching order) become K, the other (free)
dims of rhs become N, and the free dims of lhs keep their order in x [..., K]. qmatmul then
reads x as [B, S, K]: the first free lhs axis is the *example* axis and every other free lhs
axis a *token* axis (flattened), so `nn.Dense`/`nn.DenseGeneral` on [B, S, D] (also with
`features=(H, Dh)` or `axis=(-2, -1)` on [B, S, H, Dh]) see B examples of S tokens; [B, D] is
one example of B tokens. Per-token thresholds do not depend on that split; the `_bcast`
recipes' per-example thresholds and the S3R-EC means (per example) do.
Batch dims (lhs_batch, rhs_batch) are a vmap: each batch index is its own matmul with its own
weight slice, scales, step Δ and key (split from the layer's key). A contraction over no
dimension (an outer product) is not a matmul and raises.

Key plumbing (stochastic recipes need a fresh key per layer and step, in the backward only):
- `dot_general(recipe, key)`: a pure function with the key you give it.
- `LinenDotGeneral` (Linen module): draws its key from the `"quant"` RNG stream when `apply`
  has one (`rngs={"quant": step_key}`) and folds in `kernel_fingerprint(rhs)`; without the
  stream the forward runs (evaluation) and a gradient raises, saying how to pass the key. The
  fingerprint (a hash of a few kernel elements, bit for bit) makes layers with different
  weights draw different keys even where Linen hands them the same one: `nn.scan`/`nn.vmap`
  over layers without `"quant"` in `split_rngs`. Only layers with bit-identical kernels (their
  `params` not split either, or a constant init such as zeros, until the first update) share
  a key. Keys stay a deterministic function of (stream key, kernel).
- `NnxDotGeneral` (NNX module): draws one key from the given `Rngs`' `"quant"` stream when
  built (so layers built from one `Rngs` differ, and `params` is never touched) and owns a
  stream seeded with it; a new key per call. `check_keys(model)` finds layers that share keys.
"""

from __future__ import annotations

import functools
import math

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from s3r.quant import explicit
from s3r.quant.matmul import qmatmul
from s3r.quant.recipes import DEFAULT_RECIPE, Recipe
from s3r.quant.recipes import recipe as get_recipe


def _matmul(lhs, rhs, lhs_contract, rhs_contract, *, key, recipe, tp, tp_axis):
  """dot_general without batch dims as qmatmul(x [lhs free..., K], w [K, N]) -> [lhs free..., rhs free...]."""
  lhs_free = [d for d in range(lhs.ndim) if d not in lhs_contract]
  rhs_free = [d for d in range(rhs.ndim) if d not in rhs_contract]
  lhs_perm, rhs_perm = lhs_free + list(lhs_contract), list(rhs_contract) + rhs_free
  x = lhs if lhs_perm == list(range(lhs.ndim)) else jnp.transpose(lhs, lhs_perm)
  w = rhs if rhs_perm == list(range(rhs.ndim)) else jnp.transpose(rhs, rhs_perm)
  k = math.prod(lhs.shape[d] for d in lhs_contract)
  free_shape = tuple(lhs.shape[d] for d in lhs_free)
  out_shape = free_shape + tuple(rhs.shape[d] for d in rhs_free)
  y = qmatmul(x.reshape(free_shape + (k,)), w.reshape(k, -1), key=key, recipe=recipe, tp=tp, tp_axis=tp_axis)
  return y.reshape(out_shape)


def _to_front(a, dims):
  """`a` with `dims` moved to the front and flattened into one axis; the new positions of the others."""
  rest = [d for d in range(a.ndim) if d not in dims]
  moved = jnp.transpose(a, list(dims) + rest)
  return moved.reshape((math.prod(a.shape[d] for d in dims),) + tuple(a.shape[d] for d in rest)), rest


def _quantized_dot(lhs, rhs, dimension_numbers, *, key, recipe, tp=None, tp_axis="tensor", out_sharding=None):
  """`lax.dot_general(lhs, rhs, dimension_numbers)` through qmatmul. Under a mesh with Explicit axes it
  runs with Auto axes inside (the reshapes of lhs and rhs merge sharded dims), its result sharded as
  `out_sharding` or, if None, as `lax.dot_general`'s (see s3r/quant/explicit.py)."""
  if explicit.explicit_axes():
    out = out_sharding if out_sharding is not None else explicit.dot_general_spec(lhs, rhs, dimension_numbers)
    body = functools.partial(_quantized_dot, dimension_numbers=dimension_numbers, recipe=recipe, tp=tp, tp_axis=tp_axis)
    return explicit.run_auto(lambda lhs, rhs, key: body(lhs, rhs, key=key), out, lhs, rhs, key)
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_contract, rhs_contract = (
    tuple(d % a.ndim for d in dims) for a, dims in ((lhs, lhs_contract), (rhs, rhs_contract))
  )
  lhs_batch, rhs_batch = (tuple(d % a.ndim for d in dims) for a, dims in ((lhs, lhs_batch), (rhs, rhs_batch)))
  if not lhs_contract or len(lhs_contract) != len(rhs_contract) or len(lhs_batch) != len(rhs_batch):
    raise NotImplementedError(
      f"s3r dot_general: dimension_numbers={dimension_numbers} for lhs {tuple(lhs.shape)}, rhs {tuple(rhs.shape)} "
      "is not a matmul (it needs at least one contracting dim, paired between lhs and rhs)"
    )
  kw = dict(recipe=recipe, tp=tp, tp_axis=tp_axis)
  if not lhs_batch:
    return _matmul(lhs, rhs, lhs_contract, rhs_contract, key=key, **kw)
  batch_shape = tuple(lhs.shape[d] for d in lhs_batch)
  lhs_g, lhs_rest = _to_front(lhs, lhs_batch)
  rhs_g, rhs_rest = _to_front(rhs, rhs_batch)
  lc, rc = tuple(lhs_rest.index(d) for d in lhs_contract), tuple(rhs_rest.index(d) for d in rhs_contract)
  keys = None if key is None else jax.random.split(key, lhs_g.shape[0])  # one key per batch index
  y = jax.vmap(lambda a, b, k: _matmul(a, b, lc, rc, key=k, **kw))(lhs_g, rhs_g, keys)
  return y.reshape(batch_shape + y.shape[1:])


_FINGERPRINT_RUN = 4  # kernel elements read at each end of the last axis by `kernel_fingerprint`


def kernel_fingerprint(w: jax.Array) -> jax.Array:
  """A uint32 hash of a few elements of `w` (bit patterns): its first and last `_FINGERPRINT_RUN`.

  One gather of those 2·`_FINGERPRINT_RUN` elements at static indices (no reshape or slice of
  `w`: the SPMD partitioner runs a gather at constant indices on each shard and all-reduces the
  few elements, where a slice of a sharded dim can move a whole row or column), bitcast to
  uint32 and mixed with wrapping multiply-adds. Not differentiated.
  """
  if w.size == 0:
    return jnp.uint32(0)
  run = min(_FINGERPRINT_RUN, w.shape[-1])
  lead = [np.array([0] * run + [d - 1] * run) for d in w.shape[:-1]]
  last = np.concatenate([np.arange(run), np.arange(w.shape[-1] - run, w.shape[-1])])
  index = (*lead, last)
  # under Explicit axes the gather states its (replicated) result; the same gather otherwise
  v = w.at[index].get(out_sharding=jax.sharding.PartitionSpec()) if explicit.explicit_axes() else w[index]
  v = jax.lax.stop_gradient(v)
  if jnp.issubdtype(v.dtype, jnp.floating):  # exact for bf16/f16/f32 (float64: rounded to float32 first)
    bits = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)
  else:
    bits = v.astype(jnp.uint32)
  bits = bits ^ (bits >> 15)
  weights = jnp.arange(1, 2 * bits.size, 2, dtype=jnp.uint32) * jnp.uint32(0x9E3779B1)  # odd, per position
  return jnp.sum(bits * weights, dtype=jnp.uint32)


def dot_general(
  recipe: str | Recipe,
  key: jax.Array | None,
  *,
  tp: str | None = None,
  tp_axis: str = "tensor",
  fold_kernel: bool = False,
):
  """A `lax.dot_general`-compatible function that runs `s3r.qmatmul` with this key and recipe.

  `key` may be None for forward-only use; a gradient through a stochastic recipe then raises.
  `fold_kernel`: use `fold_in(key, kernel_fingerprint(rhs))` instead of `key` (what the Linen
  adapters do, so that layers handed one key by an unsplit RNG stream still differ).
  `tp` ("row" or "column") and `tp_axis` describe the kernel's tensor-parallel split, as in
  `s3r.qmatmul`: under a mesh with that axis, partial sums are rounded per shard.
  The output has lhs's dtype, or `preferred_element_type` when the caller asks for one. Its sharding: under
  a mesh with Explicit axes, the caller's `out_sharding`, else that of `lax.dot_general`; under Auto axes
  `out_sharding` is ignored (the partitioner places the result).
  """
  recipe = get_recipe(recipe)

  def fn(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None, **unused):
    del precision, unused  # the recipe fixes the numerics
    k = jax.random.fold_in(key, kernel_fingerprint(rhs)) if fold_kernel and key is not None else key
    kw = dict(recipe=recipe, tp=tp, tp_axis=tp_axis, out_sharding=out_sharding)
    y = _quantized_dot(lhs, rhs, dimension_numbers, key=k, **kw)
    return y if preferred_element_type is None else y.astype(preferred_element_type)

  return fn


class LinenDotGeneral(linen.Module):
  """Linen `dot_general` that quantizes with `recipe`, keyed from the `rng_collection` stream if present.

  The key is `fold_in(make_rng(rng_collection), kernel_fingerprint(rhs))` (see the module doc).
  """

  recipe: str | Recipe = DEFAULT_RECIPE  # recipe name or Recipe
  rng_collection: str = "quant"  # RNG stream to draw the backward-pass key from (absent: forward-only)
  tp: str | None = None  # tensor-parallel split of the kernel: "row", "column" or None (see s3r.qmatmul)
  tp_axis: str = "tensor"  # mesh axis of that split

  @linen.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    recipe = get_recipe(self.recipe)
    key = self.make_rng(self.rng_collection) if recipe.stochastic and self.has_rng(self.rng_collection) else None
    return dot_general(recipe, key, tp=self.tp, tp_axis=self.tp_axis, fold_kernel=True)(
      lhs, rhs, dimension_numbers, preferred_element_type=preferred_element_type, **kwargs
    )


def draw_stream_key(recipe: Recipe, rngs: nnx.Rngs | None, stream: str, stack: tuple[int, ...], owner: str):
  """One key from `rngs[stream]` (split to `stack` for stacked layers), or None for deterministic recipes."""
  if not recipe.stochastic:
    return None
  if rngs is None or stream not in rngs:
    have = "no Rngs" if rngs is None else f"streams {sorted(rngs)}"
    raise ValueError(
      f"{owner}: recipe {recipe.name!r} rounds stochastically and needs an nnx.Rngs with a "
      f"{stream!r} stream, got {have}; e.g. nnx.Rngs(params=0, {stream}=1) (the {stream!r} stream "
      "is separate so that adding s3r leaves the parameter initialization unchanged)"
    )
  key = rngs[stream]()
  return jax.random.split(key, stack) if stack else key


class NnxDotGeneral(nnx.Module):
  """NNX `dot_general` that quantizes with `recipe` and draws a fresh key per call from its own stream.

  The stream is seeded with one key drawn from `rngs[stream]` when the layer is built, so layers
  built from one `Rngs` get different streams and `rngs`' other streams (`params`) are untouched.
  `stack`: leading dims of a stacked kernel (layers made by `nnx.vmap`, run by `nnx.scan`): one
  stream per stacked layer.
  """

  def __init__(
    self,
    recipe: str | Recipe = DEFAULT_RECIPE,
    *,
    rngs: nnx.Rngs | None = None,
    stream: str = "quant",
    tp: str | None = None,
    tp_axis: str = "tensor",
    stack: tuple[int, ...] = (),
  ):
    self.recipe = get_recipe(recipe)
    self.stream = stream
    self.tp, self.tp_axis = tp, tp_axis  # tensor-parallel split of the kernel (see s3r.qmatmul)
    key = draw_stream_key(self.recipe, rngs, stream, tuple(stack), "NnxDotGeneral")
    self.rngs = None if key is None else nnx.Rngs(**{stream: key})

  def next_key(self) -> jax.Array | None:
    return None if self.rngs is None else self.rngs[self.stream]()

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    return dot_general(self.recipe, self.next_key(), tp=self.tp, tp_axis=self.tp_axis)(
      lhs, rhs, dimension_numbers, preferred_element_type=preferred_element_type, **kwargs
    )


def check_keys(model: nnx.Module) -> None:
  """Raises ValueError if two s3r layers of `model` (or two slices of a stacked one) share a key stream."""
  seen: dict[bytes, str] = {}
  for path, module in nnx.iter_modules(model):
    rngs = getattr(module, "rngs", None)
    if not isinstance(module, nnx.Module) or not hasattr(module, "next_key") or rngs is None:
      continue
    stream = rngs[module.stream]
    data = jax.random.key_data(stream.key[...])
    flat = data.reshape(-1, data.shape[-1])
    counts = jnp.broadcast_to(stream.count[...], data.shape[:-1]).reshape(-1)
    for i, (k, c) in enumerate(zip(flat.tolist(), counts.tolist())):
      name = "/".join(map(str, path)) + (f"[{i}]" if data.ndim > 1 else "")
      tag = repr((k, c)).encode()
      if tag in seen:
        raise ValueError(
          f"s3r: layers {seen[tag]} and {name} draw the same quantization keys (identical "
          "thresholds). Build them from one nnx.Rngs, and under nnx.vmap/nnx.scan split the "
          "'quant' stream too (nnx.split_rngs(splits=L) without only=..., or only='quant')."
        )
      seen[tag] = name
