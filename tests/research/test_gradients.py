"""Gradient diagnostics: probes, the exact reference, underflow shares and the second-moment share."""

import functools

import jax
import jax.numpy as jnp
import pytest

from research import gradients
from s3r import model as s3r_model


@functools.cache
def _tiny():
  cfg = s3r_model.preset("tiny")
  params = s3r_model.init_params(cfg, jax.random.key(0))
  batch = jax.random.randint(jax.random.key(1), (2, 17), 0, cfg.vocab_size)
  return cfg, params, batch


@pytest.mark.slow
def test_reference_has_zero_error_and_stochastic_recipes_a_positive_one():
  cfg, params, batch = _tiny()
  errors = gradients.relative_errors(cfg, params, batch, ["int8_exact_bwd", "s3r_ec"], n_keys=2, log=lambda m: None)
  assert all(v == 0 for v in errors["int8_exact_bwd"].values())
  assert all(0 < v < 10 for v in errors["s3r_ec"].values())


def test_underflow_fractions_cover_every_projection_of_every_layer():
  cfg, params, batch = _tiny()
  fractions = gradients.underflow_fractions(cfg, params, batch)
  assert sorted(fractions) == [str(i) for i in range(cfg.n_layers)]
  for per_layer in fractions.values():
    assert list(per_layer) == list(s3r_model.PROJECTIONS)
    assert all(0 <= f < 1 for f in per_layer.values())
  assert any(f > 0 for per_layer in fractions.values() for f in per_layer.values())


@pytest.mark.slow
def test_rounding_variance_share_is_zero_for_the_deterministic_reference():
  cfg, params, batch = _tiny()
  nu = jax.tree.map(lambda p: jnp.full_like(p, 1e-8), params)
  assert gradients.rounding_variance_share(cfg, params, nu, batch, "int8_rtne", n_keys=2)["max"] == 0
  assert gradients.rounding_variance_share(cfg, params, nu, batch, "s3r", n_keys=2)["max"] > 0
