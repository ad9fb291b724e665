"""The decoder: shapes, dtypes, causality, parameter counts, per-projection keys, config checks."""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.model import layers

_apply = jax.jit(M.apply, static_argnums=0)  # eager op-by-op execution is slow on CPU


def _tiny(**overrides):
  return M.preset("tiny", **overrides)


def _tokens(cfg, b=2, s=16, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (b, s)), jnp.int32)


@pytest.fixture(scope="module")
def tiny_model():
  cfg = _tiny(recipe="s3r_ec_dx")
  return cfg, M.graphdef(cfg), M.init_params(cfg, jax.random.key(0))


def test_logits_have_batch_seq_vocab_shape_and_are_finite(tiny_model):
  cfg, graphdef, params = tiny_model
  logits = _apply(graphdef, params, _tokens(cfg), key=jax.random.key(1))
  assert logits.shape == (2, 16, cfg.vocab_size)
  assert logits.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_parameters_are_f32_master_weights(tiny_model):
  _, _, params = tiny_model
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}


def test_changing_a_future_token_leaves_earlier_logits_unchanged(tiny_model):
  cfg, graphdef, params = tiny_model
  tokens = _tokens(cfg)
  changed = tokens.at[:, 10].set((tokens[:, 10] + 1) % cfg.vocab_size)
  key = jax.random.key(1)
  before = _apply(graphdef, params, tokens, key=key)
  after = _apply(graphdef, params, changed, key=key)
  np.testing.assert_array_equal(before[:, :10], after[:, :10])
  assert not np.array_equal(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("name", list(M.PRESETS))
def test_preset_table_lists_the_total_and_active_parameter_counts(name):
  cfg = M.PRESETS[name]
  module = importlib.import_module(f"s3r.model.families.{cfg.family}")  # the family's module holds its presets
  row = re.search(rf"\| `{re.escape(name)}`.*\| ([\d,]+) *\| ([\d,]+) *\|", module.__doc__ or "")
  assert row, f"preset {name} missing from the table in {module.__name__}"
  assert int(row.group(1).replace(",", "")) == M.param_count(cfg)
  assert int(row.group(2).replace(",", "")) == M.active_param_count(cfg)


def test_every_projection_of_every_layer_gets_its_own_key(monkeypatch):
  cfg = _tiny(recipe="s3r", scan_layers=False)  # keys seen per traced layer: the unrolled loop
  graphdef, params = M.graphdef(cfg), M.init_params(cfg, jax.random.key(0))
  seen = []

  def recording_qmatmul(x, w, *, key, recipe, tp, compute_dtype):
    seen.append(tuple(np.asarray(jax.random.key_data(key)).tolist()))
    assert recipe.name == "s3r" and tp in ("row", "column") and compute_dtype == "bfloat16"
    return jnp.zeros(x.shape[:-1] + w.shape[-1:], x.dtype)

  monkeypatch.setattr(layers, "qmatmul", recording_qmatmul)
  M.apply(graphdef, params, _tokens(cfg), key=jax.random.key(7))
  first = list(seen)
  M.apply(graphdef, params, _tokens(cfg), key=jax.random.key(8))
  assert len(first) == 7 * cfg.n_layers == len(set(first))
  assert not set(first) & set(seen[len(first) :])  # another step key: other keys


def test_stochastic_recipe_without_key_is_rejected(tiny_model):
  cfg, graphdef, params = tiny_model
  with pytest.raises(ValueError, match="step key"):
    M.apply(graphdef, params, _tokens(cfg), key=None)


@pytest.mark.parametrize(
  "overrides, field",
  [
    ({"d_model": 0}, "d_model"),
    ({"n_heads": 3}, "n_heads"),
    ({"n_kv_heads": 3}, "n_kv_heads"),
    ({"recipe": "fp4"}, "recipe"),
    ({"rope_theta": 0.0}, "rope_theta"),
    ({"act_dtype": "float16"}, "act_dtype"),
  ],
)
def test_invalid_config_is_rejected_naming_the_field(overrides, field):
  with pytest.raises(ValueError, match=field):
    _tiny(**overrides)


def test_unknown_preset_lists_the_valid_ones():
  with pytest.raises(ValueError, match="cpu-small"):
    M.preset("huge")


@pytest.mark.parametrize("count", [1, 6, 7])
def test_folded_keys_are_the_fold_in_keys_bit_for_bit(count):
  """A layer's projection keys come from one vectorized fold_in (`layers.folded_keys`, one threefry hash for
  XLA to fuse instead of one per projection): each is the key fold_in(key, i) itself, eagerly and under jit,
  so every recipe draws the same thresholds as with a fold_in per projection."""
  key = jax.random.fold_in(jax.random.key(3), 11)
  want = np.stack([jax.random.key_data(jax.random.fold_in(key, i)) for i in range(count)])
  eager = jax.random.key_data(layers.folded_keys(key, count))
  jitted = jax.jit(lambda k: jax.random.key_data(layers.folded_keys(k, count)))(key)
  np.testing.assert_array_equal(eager, want)
  np.testing.assert_array_equal(jitted, want)
