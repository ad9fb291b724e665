"""The scanned decoder (scan_layers=True, the default) against the same parameters run unrolled: the
stacked layout, equal gradients and losses, generation, the per-layer layout of older checkpoints."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from research import taps
from s3r import model as M
from s3r.model import stack
from s3r.model.transformer import block_class
from s3r.quant import RECIPES
from s3r.train import step as train_step
from s3r.train.run import checkpoint
from s3r.train.step import optimizer as opt
from tests.conftest import xla_flags
from tests.model import family_facts

FAMILIES = family_facts.SIBLINGS  # one CPU-sized preset per registered family
# Gemma 3 with a 2-layer local:global period over 3 layers: local, global, local (the remainder).
GEMMA_PATTERN = {"global_every": 2, "n_layers": 3, "sliding_window": 4}


def _cfg(name, **overrides):
  cfg = M.preset(name, **overrides)
  if isinstance(cfg, M.Gemma3Config):
    cfg = dataclasses.replace(cfg, **GEMMA_PATTERN)
  return cfg


def _loss_and_grads(cfg, params, tokens_BxS1, key):
  """jit(value_and_grad) of the training loss (+ the MoE balance loss) with respect to the parameters
  and to one zero probe per layer (the activation gradient entering each layer, research.taps)."""
  probes = [jnp.zeros((*tokens_BxS1[:, :-1].shape, cfg.d_model), jnp.float32) for _ in range(cfg.n_layers)]

  def loss(params, probes):
    logits, per_layer = taps.apply(cfg, params, tokens_BxS1[:, :-1], key=key, taps=taps.Taps(probes=probes))
    balance = sum(a["load_balance_loss"] for a in per_layer) if per_layer else 0.0
    return train_step.cross_entropy(logits, tokens_BxS1[:, 1:]) + balance

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, probes)


def test_the_stacked_parameters_are_the_per_layer_blocks_initialized_from_their_own_keys():
  cfg = _cfg("deepseek-tiny")  # two segments: the dense first layer, then the MoE layers
  params = M.init_params(cfg, jax.random.key(0))
  assert [(s.name, s.start, s.count) for s in stack.segments(cfg)] == [("dense_layers", 0, 1), ("layers", 1, 2)]
  layer_keys = jax.random.split(jax.random.split(jax.random.key(0), 3)[1], cfg.n_layers)
  per_layer = stack.unstack(params, cfg)["blocks"]
  for layer in range(cfg.n_layers):
    want = nnx.to_pure_dict(nnx.state(block_class(cfg)(cfg, layer_keys[layer], layer)))
    jax.tree.map(np.testing.assert_array_equal, per_layer[layer], want)
  again = stack.stack(stack.unstack(params, cfg), cfg)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), again, params))


def test_the_layer_axis_is_never_sharded():
  cfg = _cfg("qwen3-moe-tiny")
  specs = M.logical_axes(cfg)
  shapes = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  for name in ("layers",):
    for spec, shape in zip(
      jax.tree.leaves(specs[name], is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
      jax.tree.leaves(shapes[name]),
    ):
      assert spec[0] is None and len(spec) == len(shape.shape)


# in the default suite: the families whose scan differs most from one plain scan (e.g. Gemma's per-layer
# cond, DeepSeek's two segments); the others in the slow suite
SLOW_FAMILIES = {s for s in FAMILIES if not family_facts.of_sibling(s).LAYERS_DIFFER}


@pytest.mark.parametrize(
  "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_FAMILIES else n for n in FAMILIES]
)
def test_scanned_and_unrolled_losses_and_gradients_agree(name):
  """Under XLA's default excess precision the two programs may keep bf16 intermediates at different
  precisions (they fuse differently), so they agree to float tolerance; bitwise: see the test below."""
  cfg = _cfg(name, recipe="s3r_ec_dx")
  params = M.init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 17)), jnp.int32)
  (l_scan, (g_scan, p_scan)) = _loss_and_grads(cfg, params, tokens, jax.random.key(3))
  (l_loop, (g_loop, p_loop)) = _loss_and_grads(
    dataclasses.replace(cfg, scan_layers=False), params, tokens, jax.random.key(3)
  )
  np.testing.assert_allclose(float(l_scan), float(l_loop), rtol=1e-3)
  rel = lambda a, b: float(jnp.linalg.norm(a - b) / (jnp.linalg.norm(b) + 1e-30))
  assert max(jax.tree.leaves(jax.tree.map(rel, g_scan, g_loop))) < 0.1
  assert max(rel(a, b) for a, b in zip(p_scan, p_loop)) < 0.1  # the probes reach every layer


BITWISE_SCRIPT = """
import dataclasses, json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {root!r})
from tests.model.test_scan import _cfg, _loss_and_grads
from research import taps
from s3r import model as M
out = {{}}
for name, recipe in {cases!r}:
  cfg = _cfg(name, recipe=recipe)
  params = M.init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 17)), jnp.int32)
  run = lambda scan: _loss_and_grads(dataclasses.replace(cfg, scan_layers=scan), params, tokens, jax.random.key(3))
  (l1, (g1, p1)), (l2, (g2, p2)) = run(True), run(False)
  same = lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b)))
  out[f"{{name}}/{{recipe}}"] = {{
    "loss": same(l1, l2),
    "grads": [
      jax.tree_util.keystr(k) for k, ok in jax.tree_util.tree_flatten_with_path(jax.tree.map(same, g1, g2))[0] if not ok
    ],
    "probes": [i for i, (a, b) in enumerate(zip(p1, p2)) if not same(a, b)],
  }}
print(json.dumps(out))
"""


def _bitwise(cases):
  """Run the scanned and unrolled models in a subprocess whose XLA rounds every bf16 op as written
  (--xla_allow_excess_precision=false), so that both programs compute the same floats."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_allow_excess_precision=false"), "PYTHONPATH": root}
  script = BITWISE_SCRIPT.format(root=root, cases=cases)
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1500)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_bitwise(result):
  for case, r in result.items():
    assert r == {"loss": True, "grads": [], "probes": []}, case


def test_scanned_and_unrolled_gradients_are_bitwise_equal_for_s3r_ec_dx():
  """Every weight gradient (the int8 GEMMs of the gradient codes times their steps) and every probe
  gradient (the activation gradient entering each layer) is bitwise the unrolled model's: the scan
  draws the same thresholds (key fold_in(fold_in(step_key, l), j)) and quantizes the same G."""
  _assert_bitwise(_bitwise([("llama-tiny", "s3r_ec_dx")]))


@pytest.mark.slow  # one subprocess compiling 2 x (13 recipes + 4 families) gradient programs
def test_every_recipe_and_family_gives_bitwise_equal_gradients_scanned_and_unrolled():
  cases = [("llama-tiny", r) for r in RECIPES if r != "s3r_ec_dx"] + [(f, "s3r_ec_dx") for f in FAMILIES[1:]]
  _assert_bitwise(_bitwise(cases))


@pytest.mark.parametrize("name", ["gemma3-tiny", "deepseek-tiny"])
def test_generation_under_the_scan_gives_the_unrolled_tokens_and_logits(name):
  cfg = _cfg(name, recipe="bf16", act_dtype="float32")
  params = M.init_params(cfg, jax.random.key(1))
  prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
  logits = {}
  for scan in (True, False):
    dec = M.Decoder(dataclasses.replace(cfg, scan_layers=scan), params, prompts, max_new_tokens=6)
    out = [dec.prefill()]
    for _ in range(5):
      out.append(dec.step(jnp.argmax(out[-1], axis=-1)))
    logits[scan] = np.stack([np.asarray(x) for x in out])
  np.testing.assert_allclose(logits[True], logits[False], rtol=1e-5, atol=1e-5)


def test_a_checkpoint_in_the_per_layer_layout_restores_stacked(tmp_path):
  cfg = _cfg("deepseek-tiny", recipe="bf16")
  tx = opt.make_optimizer(opt.OptimizerConfig(lr=1e-3, total_steps=10, warmup_steps=0))
  state = train_step.init_state(M.init_params(cfg, jax.random.key(0)), tx)
  state = state._replace(opt_state=jax.tree.map(lambda x: x + 1 if x.ndim else x, state.opt_state))
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  ckpt.save(3, stack.unstack_all(state, cfg), {"train_config": {}})  # as a run before the stacking wrote it
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
  with pytest.raises(Exception):  # noqa: B017 (orbax's error for a tree of another structure)
    ckpt.restore(abstract, 3)
  restored, meta = ckpt.restore(abstract, 3, fallback=checkpoint.per_layer_fallback(cfg))
  ckpt.close()
  assert meta == {"train_config": {}}
  same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), restored, state)
  assert jax.tree.structure(restored) == jax.tree.structure(state) and jax.tree.all(same)


def test_weight_decay_skips_the_stacked_norm_scales():
  cfg = _cfg("qwen3-tiny")
  params = M.init_params(cfg, jax.random.key(0))
  ndim = stack.per_layer_ndim(params)
  assert ndim["layers"]["q_norm"]["scale"] == 1 and ndim["layers"]["q"] == 2 and ndim["embed"] == 2
