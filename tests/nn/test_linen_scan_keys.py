"""Linen keys under nn.scan/nn.vmap: the kernel's fingerprint is folded into the "quant" key, so layers
that the transform hands one broadcast key still draw different thresholds, reproducibly; a stream left
out of split_rngs never reaches the layers and a gradient says so."""

import functools
import importlib
import json
import subprocess
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r.nn as snn
from labtools.analysis.jaxpr import shaped

dg_module = importlib.import_module("s3r.nn.dot_general")

LAYERS = 3
BROADCAST: dict[Any, bool] = {"params": True, "quant": False}  # params split per layer, the "quant" stream broadcast
X = jax.random.normal(jax.random.key(0), (2, 4, 8))


_CAPTURED: list[jax.Array] = []  # the key data the spy saw, within the current trace


class _Block(nn.Module):
  quantized: bool = True  # LinenDotGeneral here; False: a plain nn.Dense, for s3r.nn.quantize

  @nn.compact
  def __call__(self, x, _):
    kwargs: dict[str, Any] = (
      {"dot_general_cls": functools.partial(snn.LinenDotGeneral, recipe="s3r_ec_dx")} if self.quantized else {}
    )
    y = nn.Dense(8, **kwargs)(x)
    # The key the layer used leaves as the scan's per-layer output (an effect such as
    # jax.debug.callback inside a Flax scan body is refused: "broadcasted variable has a data
    # dependency on the scan body").
    key = _CAPTURED.pop() if _CAPTURED else jnp.zeros((1, 2), jnp.uint32)
    return y, key


def _scanned(split_rngs, quantized=True):
  return nn.scan(_Block, variable_axes={"params": 0}, split_rngs=split_rngs, length=LAYERS)(quantized)


def _keys_used(monkeypatch, apply) -> np.ndarray:
  """The key data each quantized dot_general received while `apply()` ran, one row per call.

  `apply` returns the scanned block's outputs `(y, keys)`; the spy hands each key to `_Block`."""
  real = dg_module._quantized_dot

  def spy(lhs, rhs, dimension_numbers, *, key, **kw):
    _CAPTURED.append(jax.random.key_data(key).reshape(-1, 2))
    return real(lhs, rhs, dimension_numbers, key=key, **kw)

  with monkeypatch.context() as patch:
    patch.setattr(dg_module, "_quantized_dot", spy)
    _CAPTURED.clear()
    keys = np.asarray(jax.block_until_ready(apply()[1]))
  assert not _CAPTURED, "a key was drawn outside the scanned block"
  return keys.reshape(-1, 2)


def _distinct(keys: np.ndarray) -> int:
  return len({k.tobytes() for k in keys})


@pytest.mark.parametrize("quantized", [True, False], ids=["LinenDotGeneral", "quantize"])
def test_scanned_layers_draw_different_keys_when_the_quant_stream_is_broadcast(monkeypatch, quantized):
  model = _scanned(BROADCAST, quantized)  # every layer gets the same "quant" stream key
  q = model if quantized else snn.quantize(model, "s3r_ec_dx")
  variables = q.init(jax.random.key(1), X, None)
  run = lambda: q.apply(variables, X, None, rngs={"quant": jax.random.key(2)})
  keys = _keys_used(monkeypatch, run)
  assert keys.shape[0] == LAYERS and _distinct(keys) == LAYERS
  fingerprint = dg_module.kernel_fingerprint
  monkeypatch.setattr(dg_module, "kernel_fingerprint", lambda w: fingerprint(w) * 0)  # without the fingerprint ...
  assert _distinct(_keys_used(monkeypatch, run)) == 1  # ... this setting gives every layer one key


def test_vmapped_layers_draw_different_keys_when_the_quant_stream_is_broadcast(monkeypatch):
  model = nn.vmap(_Block, variable_axes={"params": 0}, split_rngs=BROADCAST, in_axes=(None, None), axis_size=LAYERS)()
  variables = model.init(jax.random.key(1), X, None)
  keys = _keys_used(monkeypatch, lambda: model.apply(variables, X, None, rngs={"quant": jax.random.key(2)}))
  assert keys.shape[0] == LAYERS and _distinct(keys) == LAYERS


@pytest.mark.parametrize("quantized", [True, False], ids=["LinenDotGeneral", "quantize"])
def test_a_quant_stream_left_out_of_split_rngs_makes_a_gradient_raise_naming_split_rngs(quantized):
  model = _scanned({"params": True}, quantized)  # Flax passes only the streams named in split_rngs
  q = model if quantized else snn.quantize(model, "s3r_ec_dx")
  variables = q.init(jax.random.key(1), X, None)
  loss = lambda p: jnp.sum(q.apply({"params": p}, X, None, rngs={"quant": jax.random.key(2)})[0])
  with pytest.raises(ValueError, match="name 'quant' in split_rngs"):
    jax.grad(loss)(variables["params"])


def test_same_stream_key_and_kernel_give_the_same_key_and_gradient(monkeypatch):
  model = _scanned(BROADCAST)
  variables = model.init(jax.random.key(1), X, None)

  def loss(params, seed):
    return jnp.sum(model.apply({"params": params}, X, None, rngs={"quant": jax.random.key(seed)})[0] ** 2)

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_a, g_b, g_c = (np.asarray(grad(variables["params"], s)["Dense_0"]["kernel"]) for s in (2, 2, 3))
  np.testing.assert_array_equal(g_a, g_b)
  assert not np.array_equal(g_a, g_c)
  run = lambda: model.apply(variables, X, None, rngs={"quant": jax.random.key(2)})
  np.testing.assert_array_equal(_keys_used(monkeypatch, run), _keys_used(monkeypatch, run))


def test_layers_with_bit_identical_kernels_share_a_key(monkeypatch):
  model = _scanned({"params": False, "quant": False})  # params not split either: one kernel for every layer
  variables = model.init(jax.random.key(1), X, None)
  keys = _keys_used(monkeypatch, lambda: model.apply(variables, X, None, rngs={"quant": jax.random.key(2)}))
  assert keys.shape[0] == LAYERS and _distinct(keys) == 1


def test_kernel_fingerprint_reads_a_few_elements_and_sees_each_of_them():
  w = jax.random.normal(jax.random.key(0), (64, 96))
  jaxpr = jax.make_jaxpr(dg_module.kernel_fingerprint)(w).jaxpr
  run = dg_module._FINGERPRINT_RUN
  readers = [e for e in jaxpr.eqns if jaxpr.invars[0] in e.invars]
  assert [e.primitive.name for e in readers] == ["gather"] and shaped(readers[0].outvars[0]).shape == (2 * run,)
  assert max(int(np.prod(shaped(v).shape)) for e in jaxpr.eqns for v in e.outvars) <= 2 * run * w.ndim  # + indices
  base = int(dg_module.kernel_fingerprint(w))
  for index in [(0, 0), (0, 3), (63, 92), (63, 95)]:  # the first and last elements along the last axis
    assert int(dg_module.kernel_fingerprint(w.at[index].add(1e-6))) != base
  assert int(dg_module.kernel_fingerprint(w.at[10, 10].add(1.0))) == base  # the rest is not read
  assert int(dg_module.kernel_fingerprint(w)) == base


_SHARDED_FINGERPRINT = """
import importlib, json, re, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
fingerprint = importlib.import_module("s3r.nn.dot_general").kernel_fingerprint
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
w = jax.random.normal(jax.random.key(0), (64, 96))
result = {}
for spec in [P(None, "a"), P("a", None), P("a", "b"), P(("a", "b"), None)]:
  sharded = jax.device_put(w, NamedSharding(mesh, spec))
  hlo = jax.jit(fingerprint).lower(sharded).compile().as_text()
  moved = [re.search(r"= \\(?\\w+\\[([\\d,]*)\\]", line).group(1) for line in hlo.splitlines()
           if re.search(r" (all-gather|all-reduce|collective-permute|all-to-all)(-start)?\\(", line)]
  result[str(spec)] = {"moved": [int(np.prod([int(d) for d in m.split(",") if d])) for m in moved],
                       "equal": int(jax.jit(fingerprint)(sharded)) == int(fingerprint(w))}
json.dump(result, sys.stdout)
"""


def test_a_sharded_kernels_fingerprint_equals_the_unsharded_one_and_moves_only_those_elements():
  from tests.distributed.conftest import REPO, device_env

  proc = subprocess.run(
    [sys.executable, "-c", _SHARDED_FINGERPRINT],
    env=device_env(4),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout)
  for spec, r in result.items():
    assert r["equal"], spec
    assert r["moved"] and max(r["moved"]) <= 2 * dg_module._FINGERPRINT_RUN, (spec, r["moved"])
