"""Taps on the decoder's blocks from outside the model (research.taps): zero taps change no number,
the decoder keeps its scan under them, and they see every layer."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research import taps
from s3r import model as s3r_model


@functools.cache
def _tiny(scan_layers: bool = True):
  cfg = dataclasses.replace(s3r_model.preset("tiny", recipe="s3r_ec_dx"), scan_layers=scan_layers)
  params = s3r_model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  return cfg, params, tokens


def _all_taps(cfg, tokens) -> taps.Taps:
  b, s = tokens.shape
  widths = {"q": cfg.n_heads * cfg.head_dim, "k": cfg.n_kv_heads * cfg.head_dim, "v": cfg.n_kv_heads * cfg.head_dim}
  widths |= {"o": cfg.d_model, "gate": cfg.d_ff, "up": cfg.d_ff, "down": cfg.d_model}
  return taps.Taps(
    probes=[jnp.zeros((b, s, cfg.d_model)) for _ in range(cfg.n_layers)],
    offsets=[{n: jnp.zeros((b, s, w)) for n, w in widths.items()} for _ in range(cfg.n_layers)],
    record=True,
  )


def test_zero_taps_leave_the_logits_unchanged():
  cfg, params, tokens = _tiny()
  key = jax.random.key(3)
  plain = s3r_model.apply(s3r_model.graphdef(cfg), params, tokens, key=key)
  tapped, per_layer = taps.apply(cfg, params, tokens, key=key, taps=_all_taps(cfg, tokens))
  np.testing.assert_array_equal(np.asarray(plain), np.asarray(tapped))
  seen = [a["projections"] for a in per_layer]
  assert len(seen) == cfg.n_layers and all(sorted(s) == sorted(s3r_model.PROJECTIONS) for s in seen)


def test_the_tapped_model_keeps_its_scan_over_the_layers():
  cfg, params, tokens = _tiny()
  all_taps = _all_taps(cfg, tokens)
  jaxpr = jax.make_jaxpr(lambda p: taps.apply(cfg, p, tokens, key=jax.random.key(3), taps=all_taps))(params)
  scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
  assert [e.params["length"] for e in scans] == [cfg.n_layers]


@pytest.mark.parametrize("scan_layers", [True, False])
def test_the_taps_report_each_layers_own_projection_inputs_and_weights(scan_layers):
  cfg, params, tokens = _tiny(scan_layers)
  all_taps = _all_taps(cfg, tokens)
  _, per_layer = jax.jit(lambda p: taps.apply(cfg, p, tokens, key=jax.random.key(3), taps=all_taps))(params)
  seen = [a["projections"] for a in per_layer]
  for layer in range(cfg.n_layers):
    segment, row = s3r_model.stack.locate(cfg, layer)
    for name in s3r_model.PROJECTIONS:
      np.testing.assert_array_equal(np.asarray(seen[layer][name][1]), np.asarray(params[segment][name][row]))
  assert not np.array_equal(np.asarray(seen[0]["q"][0]), np.asarray(seen[1]["q"][0]))  # each layer's own input
  assert seen[0]["q"][2] is not None and not np.array_equal(
    jax.random.key_data(seen[0]["q"][2]), jax.random.key_data(seen[1]["q"][2])
  )


def test_a_block_that_is_no_subclass_of_the_familys_block_is_refused():
  cfg, _, _ = _tiny()
  with pytest.raises(ValueError, match="block: must be a subclass of"):
    s3r_model.graphdef(cfg, block=dict)  # pyrefly: ignore[bad-argument-type]  # the wrong type is the test
