"""NNX key streams (per layer, never from params, checked), and quantize() for NNX and Linen models."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import s3r
import s3r.nn as snn
from labtools.analysis import jaxpr as inspect

X = jax.random.normal(jax.random.key(0), (2, 4, 8))


def _key_data(dg):
  return np.asarray(jax.random.key_data(dg.rngs["quant"].key[...]))


def test_import_s3r_exposes_nn():
  assert s3r.nn.quantize is snn.quantize


def test_layers_built_from_one_rngs_get_different_streams_and_params_are_untouched():
  rngs = nnx.Rngs(params=0, quant=1)
  a, b = snn.NnxDotGeneral("s3r", rngs=rngs), snn.NnxDotGeneral("s3r", rngs=rngs)
  assert not np.array_equal(_key_data(a), _key_data(b))
  plain = nnx.Linear(8, 6, rngs=nnx.Rngs(params=0))
  rngs = nnx.Rngs(params=0, quant=1)
  quant = nnx.Linear(8, 6, rngs=rngs, dot_general=snn.NnxDotGeneral("s3r", rngs=rngs))
  np.testing.assert_array_equal(np.asarray(plain.kernel[...]), np.asarray(quant.kernel[...]))


def test_missing_quant_stream_is_reported_when_the_layer_is_built():
  with pytest.raises(ValueError, match=r"needs an nnx.Rngs with a 'quant' stream.*nnx.Rngs\(params=0, quant=1\)"):
    snn.NnxDotGeneral("s3r_ec_dx", rngs=nnx.Rngs(0))
  snn.NnxDotGeneral("int8_rtne", rngs=nnx.Rngs(0))  # deterministic recipes need none


def test_check_keys_reports_layers_seeded_alike():
  class Two(nnx.Module):
    def __init__(self, seeds):
      self.a = nnx.Linear(8, 8, rngs=nnx.Rngs(0), dot_general=snn.NnxDotGeneral("s3r", rngs=nnx.Rngs(quant=seeds[0])))
      self.b = nnx.Linear(8, 8, rngs=nnx.Rngs(1), dot_general=snn.NnxDotGeneral("s3r", rngs=nnx.Rngs(quant=seeds[1])))

  snn.check_keys(Two((0, 1)))
  with pytest.raises(ValueError, match="a/dot_general and b/dot_general draw the same quantization keys"):
    snn.check_keys(Two((0, 0)))


class _Mlp(nnx.Module):
  def __init__(self, rngs):
    self.up = nnx.Linear(8, 16, rngs=rngs)
    self.down = nnx.Linear(16, 8, rngs=rngs)
    self.lm_head = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, x):
    return self.lm_head(self.down(jax.nn.relu(self.up(x))))


def test_nnx_quantize_keeps_params_skips_named_layers_and_counts_int8_gemms():
  model = _Mlp(nnx.Rngs(0))
  before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  snn.quantize(model, "s3r_ec_dx", skip=("lm_head",), rngs=3)
  after = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  jax.tree.map(np.testing.assert_array_equal, before, after)
  assert isinstance(model.up.dot_general, snn.NnxDotGeneral) and model.lm_head.dot_general is jax.lax.dot_general
  graphdef, state = nnx.split(model)
  jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(X))(state)
  assert len(inspect.int8_dots(jaxpr)) == 2  # up and down, not lm_head


def test_stacked_layers_under_nnx_vmap_get_one_stream_each_and_unsplit_streams_are_loud():
  layers = 3

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.linear = nnx.Linear(8, 8, rngs=rngs, dot_general=snn.NnxDotGeneral("s3r", rngs=rngs))

  def build(split_only):
    @nnx.split_rngs(splits=layers, only=split_only)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return Block(rngs)

    return create(nnx.Rngs(params=0, quant=1))

  good = build(...)
  keys = _key_data(good.linear.dot_general)
  assert keys.shape[0] == layers and len({k.tobytes() for k in keys}) == layers
  snn.check_keys(good)
  with pytest.raises(ValueError):  # the quant stream not split: nnx.vmap refuses to map it
    build("params")
  twice = build(...)
  dg = twice.linear.dot_general
  assert isinstance(dg, snn.NnxDotGeneral) and dg.rngs is not None
  dg.rngs["quant"].key[...] = jnp.stack([dg.rngs["quant"].key[...][0]] * 3)
  with pytest.raises(ValueError, match=r"linear/dot_general\[0\] and linear/dot_general\[1\] draw the same"):
    snn.check_keys(twice)

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
  def forward(x, block):
    return block.linear(x)

  @nnx.jit
  def grads(model):
    return nnx.grad(lambda m: jnp.sum(forward(X, m) ** 2))(model)

  assert np.isfinite(np.asarray(grads(good).linear.kernel[...])).all()


def test_quantize_finds_stacked_plain_layers_and_gives_each_its_own_stream():
  @nnx.split_rngs(splits=2)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def create(rngs):
    return _Mlp(rngs)

  model = snn.quantize(create(nnx.Rngs(0)), "s3r_ec_dx", rngs=nnx.Rngs(quant=5))
  keys = _key_data(model.up.dot_general)
  assert keys.shape[0] == 2 and not np.array_equal(keys[0], keys[1])


class _LinenMlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(16, name="up")(x))
    h = nn.DenseGeneral((2, 4), name="heads")(h)
    return nn.Dense(8, name="lm_head")(h.reshape(*h.shape[:-2], 8))


def test_linen_quantize_keeps_params_skips_named_layers_and_runs_forward_without_rngs():
  module = _LinenMlp()
  q = snn.quantize(module, "s3r_ec_dx", skip=("lm_head",))
  variables = module.init(jax.random.key(0), X)
  jax.tree.map(np.testing.assert_array_equal, variables, q.init(jax.random.key(0), X))
  y = q.apply(variables, X)  # forward only: no quant stream needed
  assert len(inspect.int8_dots(jax.make_jaxpr(lambda v: q.apply(v, X))(variables))) == 2
  assert not np.array_equal(np.asarray(y), np.asarray(module.apply(variables, X)))
  loss = lambda p, key: jnp.sum(q.apply({"params": p}, X, rngs={"quant": key}) ** 2)
  g1, g2 = (jax.grad(loss)(variables["params"], jax.random.key(k)) for k in (1, 2))
  assert not np.array_equal(np.asarray(g1["up"]["kernel"]), np.asarray(g2["up"]["kernel"]))
  np.testing.assert_array_equal(
    np.asarray(g1["up"]["kernel"]), np.asarray(jax.grad(loss)(variables["params"], jax.random.key(1))["up"]["kernel"])
  )
