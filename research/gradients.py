"""Gradient diagnostics of a trained model (the paper's Table II and its companions).

All functions take the model config, a params dict and one batch, and compare what a recipe's
backward pass produces against `int8_exact_bwd`: the same INT8 forward graph with an exact
f32 backward through every quantized projection. Only the recipe of the quantized
projections changes between the two, so the difference is the rounding error alone.

Dimension letters: B batch, S sequence, D model width.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from research import taps
from s3r import model as s3r_model
from s3r.quant import numerics
from s3r.train.step import cross_entropy

REFERENCE = "int8_exact_bwd"
METRICS = ("dx_first", "dx_last", "dw_first", "embed")
METRIC_LABELS = {
  "dx_first": "dX error, block 0 input",
  "dx_last": "dX error, last block input",
  "dw_first": "dW error, block 0",
  "embed": "embedding grad error",
}


def _with_recipe(cfg: s3r_model.ModelConfig, recipe: str) -> s3r_model.ModelConfig:
  return dataclasses.replace(cfg, recipe=recipe)


@functools.lru_cache(maxsize=16)  # one jitted function per (config, recipe): compiled once per batch shape
def probe_gradients_fn(cfg: s3r_model.ModelConfig, recipe: str) -> Callable:
  """jit(params, batch_BxS1, key) -> dict of the four gradients that Table II compares (dX: the
  gradient of a zero probe at the block's input, `research.taps`)."""
  with_recipe = _with_recipe(cfg, recipe)

  def fn(params, batch_BxS1, key):
    b, s = batch_BxS1.shape[0], batch_BxS1.shape[1] - 1
    probes = [jnp.zeros((b, s, cfg.d_model), jnp.float32) for _ in range(cfg.n_layers)]

    def loss(params, probes):
      tapped = taps.Taps(probes=probes)
      logits, _ = taps.apply(with_recipe, params, batch_BxS1[:, :-1], key=key, taps=tapped)
      return cross_entropy(logits, batch_BxS1[:, 1:])

    g_params, g_probes = jax.grad(loss, argnums=(0, 1))(params, probes)
    segment, row = s3r_model.stack.locate(cfg, 0)
    block0 = jax.tree.map(lambda a: a[row], g_params[segment])
    dw_first = jnp.concatenate([block0[name].reshape(-1) for name in s3r_model.PROJECTIONS])
    return {"dx_first": g_probes[0], "dx_last": g_probes[-1], "dw_first": dw_first, "embed": g_params["embed"]}

  return jax.jit(fn)


def relative_errors(
  cfg, params, batch_BxS1, recipes, *, n_keys: int = 16, seed: int = 0, log=print, reference_fn=None
) -> dict:
  """{recipe: {metric: sqrt(mean_k ||g_k - g||²) / ||g||}} over `n_keys` independent keys.

  `reference_fn`: a `probe_gradients_fn(cfg, REFERENCE)` to reuse (it compiles once per shape)."""
  reference_fn = reference_fn or probe_gradients_fn(cfg, REFERENCE)
  exact = reference_fn(params, batch_BxS1, jax.random.key(0))
  exact = {k: np.asarray(v, np.float64) for k, v in exact.items()}
  norms = {k: float(np.linalg.norm(v)) for k, v in exact.items()}
  keys = jax.random.split(jax.random.key(seed), n_keys)
  out = {}
  for recipe in recipes:
    fn = probe_gradients_fn(cfg, recipe)
    sq = dict.fromkeys(METRICS, 0.0)
    for key in keys:
      for name, g in fn(params, batch_BxS1, key).items():
        sq[name] += float(np.sum((np.asarray(g, np.float64) - exact[name]) ** 2))
    out[recipe] = {name: float(np.sqrt(sq[name] / n_keys) / norms[name]) for name in METRICS}
    log(f"  {recipe:<24} " + "  ".join(f"{m} {out[recipe][m]:.3f}" for m in METRICS))
  return out


def rounding_variance_share(cfg, params, nu, batch_BxS1, recipe, *, n_keys: int = 16, seed: int = 1) -> dict:
  """How much of AdamW's second moment ν the recipe's rounding variance accounts for.

  For one batch, the per-coordinate variance of the parameter gradient over `n_keys`
  quantizer keys is the rounding variance (the batch is fixed). Returns, per parameter
  tensor, Σ var / Σ ν, plus the maximum over tensors and the share over all parameters.
  """
  graphdef = s3r_model.graphdef(_with_recipe(cfg, recipe))
  grad_fn = jax.jit(jax.grad(lambda p, b, k: cross_entropy(s3r_model.apply(graphdef, p, b[:, :-1], key=k), b[:, 1:])))
  keys = jax.random.split(jax.random.key(seed), n_keys)
  samples = [jax.tree.map(lambda g: np.asarray(g, np.float64), grad_fn(params, batch_BxS1, k)) for k in keys]
  mean = jax.tree.map(lambda *g: sum(g) / n_keys, *samples)
  var = jax.tree.map(lambda m, *g: sum((x - m) ** 2 for x in g) / (n_keys - 1), mean, *samples)
  flat_var = dict(_flatten(var))
  flat_nu = dict(_flatten(jax.tree.map(lambda v: np.asarray(v, np.float64), nu)))
  per_tensor = {name: float(flat_var[name].sum() / max(flat_nu[name].sum(), 1e-300)) for name in flat_var}
  total = sum(v.sum() for v in flat_var.values()) / sum(flat_nu[n].sum() for n in flat_var)
  return {"recipe": recipe, "per_tensor": per_tensor, "max": max(per_tensor.values()), "all_params": float(total)}


def underflow_fractions(cfg, params, batch_BxS1) -> dict:
  """Per layer and projection: share of G' entries that RTNE rounds to zero (|G'| < Δ/2).

  G' = s_x G s_w is the upstream gradient of the projection with both scales folded in and
  Δ = max|G'|/127 its per-tensor step (docs/algorithm.md §1). Measured on the `int8_rtne`
  backward, i.e. on the gradients an RTNE run would actually see.
  """
  # unrolled, as the committed diagnoses were computed: under XLA's excess precision a scanned program may
  # round a bf16 intermediate differently (docs/models.md), which can move entries across Δ/2
  rtne = dataclasses.replace(_with_recipe(cfg, "int8_rtne"), scan_layers=False)
  names = [(layer, name) for layer in range(cfg.n_layers) for name in s3r_model.PROJECTIONS]

  def run(params, batch):
    fractions = []
    for x, w, g_BxSxN in projection_gradients(rtne, params, batch):
      sx = numerics.absmax_scale(x, axis=-1)[..., None]
      sw = numerics.absmax_scale(w, axis=0)
      gp = sx * g_BxSxN.astype(jnp.float32) * sw
      delta = jnp.max(jnp.abs(gp)) * numerics.INV_QMAX
      fractions.append(jnp.mean(jnp.abs(gp) < delta / 2))
    return jnp.stack(fractions)

  fractions = np.asarray(jax.jit(run)(params, batch_BxS1))
  out: dict = {}
  for (layer, name), f in zip(names, fractions):
    out.setdefault(str(layer), {})[name] = float(f)
  return out


def projection_gradients(cfg, params, batch_BxS1) -> list[tuple]:
  """[(x, w, G)] of every block projection of `cfg`'s Llama-style model, layer by layer, each layer's
  in `PROJECTIONS` order: its input, weight and upstream gradient, the forward without a key.

  G is the gradient of the loss with respect to a zero offset on the projection's output
  (`research.taps`). Traceable (call it inside `jax.jit`).
  """
  b, s = batch_BxS1.shape[0], batch_BxS1.shape[1] - 1
  widths = projection_widths(cfg)
  zeros = [{n: jnp.zeros((b, s, widths[n]), jnp.float32) for n in s3r_model.PROJECTIONS} for _ in range(cfg.n_layers)]

  def loss(offsets):
    tapped = taps.Taps(offsets=offsets, record=True)
    logits, per_layer = taps.apply(cfg, params, batch_BxS1[:, :-1], key=None, taps=tapped)
    return cross_entropy(logits, batch_BxS1[:, 1:]), [a["projections"] for a in per_layer]

  g, seen = jax.grad(loss, has_aux=True)(zeros)
  return [(*seen[layer][name][:2], g[layer][name]) for layer in range(cfg.n_layers) for name in s3r_model.PROJECTIONS]


def projection_widths(cfg) -> dict:
  """Output width N of each block projection of the Llama-style decoder, by name."""
  nh, kh = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  return {"q": nh, "k": kh, "v": kh, "o": cfg.d_model, "gate": cfg.d_ff, "up": cfg.d_ff, "down": cfg.d_model}


def _flatten(tree, prefix=""):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _flatten(v, f"{prefix}{k}/")
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      yield from _flatten(v, f"{prefix}{i}/")
  else:
    yield prefix.rstrip("/"), tree
