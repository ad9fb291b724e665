"""The registered decoder families (their facts in tests/model/families/<name>.py): forward pass against
an independent reference, published parameter counts, presets and overrides, per-projection keys,
training steps of each tiny sibling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.model import layers, moe
from s3r.model.config import MoeFields
from tests.model import family_facts, reference

_apply = jax.jit(M.apply, static_argnums=0)
ROUTING_TIE = 0.002  # router-probability gap below which bf16 activations may flip a top-k choice


def _randomized(params, seed, family: str):
  """Parameters at a scale where every architectural detail moves the logits: matrices
  N(0, 1/fan_in), embedding N(0, 1), norm scales around their identity."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed)
  out = []
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      out.append(rng.normal(0.0, 0.3, leaf.shape) + (0.0 if "gemma" in family else 1.0))
    elif "embed" in name and leaf.ndim == 2:
      out.append(rng.normal(0.0, 1.0, leaf.shape))
    else:
      out.append(rng.normal(0.0, 1.0, leaf.shape) / np.sqrt(leaf.shape[-2]))
  return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in out])


@pytest.mark.parametrize("name", family_facts.TINY)
def test_bf16_forward_matches_the_independent_reference(name):
  cfg = M.preset(name, recipe="bf16")
  params = _randomized(M.init_params(cfg, jax.random.key(0)), seed=1, family=cfg.family)
  tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (1, 40))
  got = np.asarray(_apply(M.graphdef(cfg), params, jnp.asarray(tokens, jnp.int32), key=None))[0]
  margins = []
  want = reference.forward(cfg, jax.tree.map(np.asarray, params), tokens[0], margins)
  # The model routes bf16 activations: a token whose k-th and (k+1)-th router probabilities are
  # within ROUTING_TIE of each other in float64 may legitimately pick the other expert. Such tokens
  # are left out of the comparison (they are a small minority; the rest must match).
  clear = np.min(margins, axis=0) > ROUTING_TIE if margins else np.ones(len(got), bool)
  assert clear.mean() > 0.8, f"{name}: only {clear.sum()} of {len(clear)} tokens are routed without a near-tie"
  rel = np.linalg.norm(got[clear] - want[clear]) / np.linalg.norm(want[clear])
  assert rel < 0.03, f"{name}: relative L2 error {rel:.4f} vs the float64 reference"


def test_reference_comparison_detects_a_missing_family_feature():
  cfg = M.preset("gemma3-tiny", recipe="bf16")
  params = _randomized(M.init_params(cfg, jax.random.key(0)), seed=1, family=cfg.family)
  tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (1, 40))
  got = np.asarray(_apply(M.graphdef(cfg), params, jnp.asarray(tokens, jnp.int32), key=None))[0]
  all_global = M.preset("gemma3-tiny", recipe="bf16", global_every=1)  # no sliding window, one RoPE base
  want = reference.forward(all_global, jax.tree.map(np.asarray, params), tokens[0])
  assert np.linalg.norm(got - want) / np.linalg.norm(want) > 0.1


PUBLISHED = family_facts.merged("PUBLISHED")  # total parameters of the published checkpoints (docs/models.md)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_full_size_parameter_count_equals_the_published_count(name):
  cfg = M.PRESETS[name]
  assert M.param_count(cfg) == PUBLISHED[name]
  shapes = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))  # the real blocks, nothing allocated
  assert sum(x.size for x in jax.tree.leaves(shapes)) == PUBLISHED[name]


def test_moe_active_counts_are_the_published_ones():
  # Model cards (truncated to 0.1B): Qwen3-30B-A3B "3.3B activated" (3.35B, embeddings included);
  # DeepSeek-V2-Lite "2.4B activated" (2.45B without the input embedding, 2.66B with it).
  tenths = lambda n: int(n // 100_000_000)
  assert tenths(M.active_param_count(M.PRESETS["qwen3-30b-a3b"])) == 33
  lite = M.PRESETS["deepseek-v2-lite"]
  assert tenths(M.active_param_count(lite) - lite.vocab_size * lite.d_model) == 24


@pytest.mark.parametrize("name", list(M.PRESETS))
def test_param_count_arithmetic_equals_the_initialized_shapes(name):
  cfg = M.preset(name, layers=2) if M.PRESETS[name].n_layers > 8 else M.PRESETS[name]
  shapes = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == M.param_count(cfg)
  dense = M.active_param_count(cfg) == M.param_count(cfg)
  assert dense == (not isinstance(cfg, MoeFields))


@pytest.mark.parametrize("name", list(M.PRESETS))
def test_every_parameter_has_logical_axes_of_its_rank(name):
  cfg = M.preset(name, layers=2) if M.PRESETS[name].n_layers > 8 else M.PRESETS[name]
  axes = M.logical_axes(cfg)
  shapes = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  for spec, shape in zip(
    jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)), jax.tree.leaves(shapes)
  ):
    assert len(spec) == shape.ndim


def test_overrides_slice_a_real_model():
  cfg = M.preset("llama3.1-8b", layers=2, seq=1024)
  assert (cfg.n_layers, cfg.max_seq_len, cfg.d_model) == (2, 1024, 4096)
  narrow = M.preset("qwen3-8b", width=256, layers=1)
  assert (narrow.d_model, narrow.head_dim) == (256, 128)  # the family's head dim is kept
  lite = M.preset("deepseek-v2-lite", layers=1)
  assert isinstance(lite, M.DeepSeekV2Config) and lite.dense_layers == 1


INVALID = [
  (family.sibling, *case) for family in M.FAMILIES.values() for case in family_facts.FACTS[family.name].INVALID
]


@pytest.mark.parametrize("name, overrides, field", INVALID)
def test_invalid_family_config_is_rejected_naming_the_field(name, overrides, field):
  with pytest.raises(ValueError, match=field):
    M.preset(name, **overrides)


def test_rope_scaling_kind_is_validated():
  with pytest.raises(ValueError, match="kind"):
    M.RopeScaling(kind="ntk", factor=2.0)


@pytest.mark.parametrize("name", list(M.PRESETS))
def test_config_round_trips_through_its_dict(name):
  cfg = M.PRESETS[name]
  assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", [s for s in family_facts.SIBLINGS if family_facts.of_sibling(s).LAYERS_DIFFER])
def test_every_projection_of_every_layer_gets_its_own_key(name, monkeypatch):
  cfg = M.preset(name, recipe="s3r", scan_layers=False)  # unrolled: the keys are concrete (the scan draws the same)
  seen = []

  def recording_qmatmul(x, w, *, key, recipe, tp=None, compute_dtype=None):
    seen.append(tuple(np.asarray(jax.random.key_data(key)).tolist()))
    return jnp.zeros(x.shape[:-1] + w.shape[-1:], x.dtype)

  def recording_grouped_qmatmul(x, w, group_sizes, *, key, recipe, impl=None, compute_dtype=None):
    return recording_qmatmul(x, w[0], key=key, recipe=recipe)

  monkeypatch.setattr(layers, "qmatmul", recording_qmatmul)
  monkeypatch.setattr(moe, "qmatmul", recording_qmatmul)
  monkeypatch.setattr(moe, "grouped_qmatmul", recording_grouped_qmatmul)
  M.apply(M.graphdef(cfg), M.init_params(cfg, jax.random.key(0)), jnp.zeros((1, 8), jnp.int32), key=jax.random.key(3))
  assert len(seen) == len(set(seen)) > 7 * cfg.n_layers - 1


MOE_SIBLINGS = {s: cfg for s in family_facts.SIBLINGS if isinstance(cfg := M.PRESETS[s], MoeFields)}


@pytest.mark.parametrize(  # 15-25 s each: the first MoE family in the default suite, the others slow
  "name, layers",
  [
    pytest.param(s, cfg.dense_layers + 1, marks=pytest.mark.slow if i else ())
    for i, (s, cfg) in enumerate(MOE_SIBLINGS.items())
  ],
)
def test_moe_family_trains_with_an_all_fp8_recipe(name, layers):
  """E4M3 forward and E5M2 gradients in every projection, the expert GEMMs (grouped_qmatmul) included;
  DeepSeek-V2 with one dense layer and one MoE layer."""
  from s3r.train import step as train_step
  from s3r.train.step import optimizer as opt

  cfg = M.preset(name, recipe="s3r_ec_dx@e5m2+fwd_e4m3", layers=layers)
  assert isinstance(cfg, MoeFields) and any(cfg.is_moe(i) for i in range(cfg.n_layers))
  ocfg = opt.OptimizerConfig(lr=3e-3, total_steps=100, warmup_steps=0)
  tx = opt.make_optimizer(ocfg)
  state = train_step.init_state(M.init_params(cfg, jax.random.key(0)), tx)
  step = jax.jit(train_step.make_train_step(M.graphdef(cfg), tx, opt.schedule(ocfg)))
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 17)), jnp.int32)
  losses = []
  for i in range(4):
    state, metrics = step(state, batch, jax.random.key(100 + i))
    losses.append(float(metrics["loss"]))
    assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_moe_auxiliary_loss_comes_back_from_apply_with_aux():
  cfg = M.preset("qwen3-moe-tiny", recipe="bf16")
  logits, aux = M.apply_with_aux(
    M.graphdef(cfg), M.init_params(cfg, jax.random.key(0)), jnp.arange(16, dtype=jnp.int32)[None], key=None
  )
  assert logits.shape == (1, 16, cfg.vocab_size)
  assert float(aux["load_balance_loss"]) > 0 and set(aux) == {"load_balance_loss", "dropped_fraction"}


@pytest.mark.slow  # compiling a quantized train step takes 15-75 s on a loaded two-core CPU
@pytest.mark.parametrize("name", family_facts.TINY)
def test_tiny_sibling_trains_with_s3r_ec_dx(name):
  from s3r.train import step as train_step
  from s3r.train.step import optimizer as opt

  cfg = M.preset(name, recipe="s3r_ec_dx")
  ocfg = opt.OptimizerConfig(lr=3e-3, total_steps=100, warmup_steps=0)
  tx = opt.make_optimizer(ocfg)
  state = train_step.init_state(M.init_params(cfg, jax.random.key(0)), tx)
  step = jax.jit(train_step.make_train_step(M.graphdef(cfg), tx, opt.schedule(ocfg)))
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 33)), jnp.int32)  # 32 distinct tokens
  losses = []
  for i in range(8):
    state, metrics = step(state, batch, jax.random.key(100 + i))
    losses.append(float(metrics["loss"]))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.3, losses
