"""The train step: INT8 structure of its jaxpr, learning, optimizer schedule."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labtools.analysis.jaxpr import is_int8_dot, iter_eqns, shaped
from s3r import model as M
from s3r.quant import RECIPES
from s3r.train import step as St
from s3r.train.step import optimizer as O

INT8_RECIPES = ["int8_rtne", "int8_sr", "s3r", "s3r_ec_dx", "s3r_ec", "s3r_ec_bcast"]


def _step_and_state(cfg, ocfg=O.OptimizerConfig(total_steps=50, warmup_steps=5)):
  tx = O.make_optimizer(ocfg)
  step = St.make_train_step(M.graphdef(cfg), tx, O.schedule(ocfg))
  return step, (lambda key: St.init_state(M.init_params(cfg, key), tx))


def _train_step_jaxpr(cfg, batch=2, seq=16):
  step, init = _step_and_state(cfg)
  state = jax.eval_shape(init, jax.random.key(0))
  tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
  return jax.make_jaxpr(jax.jit(step))(state, tokens, jax.random.key(1))


def _dots(jaxpr):
  return [e for e in iter_eqns(jaxpr) if e.primitive.name == "dot_general"]


@pytest.mark.parametrize("recipe", INT8_RECIPES + ["bf16"])
def test_train_step_has_three_int8_gemms_per_projection_plus_the_ec_factor_product(recipe):
  cfg = M.preset("tiny", recipe=recipe, scan_layers=False)  # unrolled: every layer's GEMMs are in the jaxpr
  batch = 2
  dots = _dots(_train_step_jaxpr(cfg, batch=batch))
  int8 = [e for e in dots if is_int8_dot(e)]
  # S3R-EC's dX correction: one small int8 dot [3B + 1, N] x [K, N] (digits of the error's
  # channel means, and a row of ones) per projection; no GEMM of `tiny` has 3B + 1 = 7 rows.
  ec_products = [e for e in int8 if shaped(e.invars[0]).shape[0] == 3 * batch + 1]
  projections = len(M.PROJECTIONS) * cfg.n_layers if RECIPES[recipe].quantized else 0
  assert len(int8) - len(ec_products) == 3 * projections  # forward, dX, dW
  assert len(ec_products) == (projections if RECIPES[recipe].correct_dx else 0)
  others = [e for e in dots if not is_int8_dot(e)]
  assert others, "embedding/logits/attention gradients are floating-point dots"
  for e in others:
    assert all(jnp.issubdtype(shaped(v).dtype, jnp.floating) for v in e.invars), e


def test_embedding_logits_and_attention_stay_bf16_in_the_forward_pass():
  cfg = M.preset("tiny", recipe="s3r_ec_dx", scan_layers=False)
  params = jax.eval_shape(lambda k: M.init_params(cfg, k), jax.random.key(0))
  tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda p, t: M.apply(M.graphdef(cfg), p, t, key=jax.random.key(1)))(params, tokens)
  dots = _dots(jaxpr)
  assert sum(map(is_int8_dot, dots)) == len(M.PROJECTIONS) * cfg.n_layers
  float_dots = [e for e in dots if not is_int8_dot(e)]
  # logits (1) + attention scores and probability-value products (2 per layer), all bf16 operands
  assert len(float_dots) == 1 + 2 * cfg.n_layers
  for e in float_dots:
    assert [shaped(v).dtype for v in e.invars] == [jnp.bfloat16, jnp.bfloat16], e
  assert shaped(float_dots[-1].outvars[0]).shape[-1] == cfg.vocab_size  # the logits projection
  embedding_lookups = [e for e in iter_eqns(jaxpr) if e.primitive.name == "gather"]
  assert embedding_lookups and shaped(embedding_lookups[0].invars[0]).dtype == jnp.bfloat16


@pytest.mark.parametrize("scan", [False, True])
def test_remat_recomputes_the_int8_forward_in_the_backward(scan):
  cfg = M.preset("tiny", recipe="s3r", remat=True, scan_layers=scan)
  int8 = [e for e in _dots(_train_step_jaxpr(cfg)) if is_int8_dot(e)]
  # 21 plus the recomputed forward dots whose outputs the backward needs; the scan's jaxpr holds one layer
  per_block = len(int8) / (1 if scan else cfg.n_layers)
  assert 3 * len(M.PROJECTIONS) < per_block <= 4 * len(M.PROJECTIONS)


def _chain_batches(vocab, batch, seq, n, seed=0):
  """Sequences that follow a fixed random successor table: next = succ[current]."""
  rng = np.random.default_rng(seed)
  succ = rng.permutation(vocab)
  for _ in range(n):
    rows = [rng.integers(0, vocab, batch)]
    for _ in range(seq):
      rows.append(succ[rows[-1]])
    yield jnp.asarray(np.stack(rows, axis=1), jnp.int32)


def test_loss_falls_on_a_short_tiny_run():
  cfg = M.preset("tiny", recipe="s3r_ec_dx", vocab_size=64)
  step, init = _step_and_state(cfg, O.OptimizerConfig(lr=3e-3, total_steps=40, warmup_steps=4))
  step = jax.jit(step, donate_argnums=0)
  state, train_key = init(jax.random.key(0)), jax.random.key(1)
  losses, grad_norms = [], []
  for batch in _chain_batches(cfg.vocab_size, 8, 32, 40):
    state, metrics = step(state, batch, train_key)
    losses.append(float(metrics["loss"]))
    grad_norms.append(float(metrics["grad_norm"]))
  assert int(state.step) == 40
  assert np.all(np.isfinite(losses)) and np.all(np.isfinite(grad_norms))
  assert abs(losses[0] - np.log(cfg.vocab_size)) < 0.3  # starts near uniform
  assert np.mean(losses[-5:]) < losses[0] - 1.0, losses


def test_cross_entropy_is_the_token_mean_in_f32():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 5)), jnp.bfloat16)
  targets = jnp.asarray([[0, 1, 2], [3, 4, 0]])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  expected = -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))
  loss = St.cross_entropy(logits, targets)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_lr_warms_up_linearly_from_the_first_step_then_decays_by_cosine_to_the_floor():
  cfg = O.OptimizerConfig(lr=1e-3, total_steps=100, warmup_steps=10, final_lr_ratio=0.1)
  lr = O.schedule(cfg)  # lr(c): the update with optax count c, which makes step c + 1
  np.testing.assert_allclose([lr(0), lr(4), lr(9)], [1e-4, 5e-4, 1e-3], rtol=1e-6)  # steps 1, 5, 10
  np.testing.assert_allclose(lr(54), 1e-4 + 0.5 * 9e-4, rtol=1e-5)  # step 55: half-way through the cosine
  np.testing.assert_allclose(lr(99), 1e-4, rtol=1e-5)  # step 100
  assert all(lr(s) >= lr(s + 1) for s in range(9, 100))


def test_without_warm_up_the_first_step_trains_at_the_peak():
  lr = O.schedule(O.OptimizerConfig(lr=1e-3, total_steps=10, warmup_steps=0, final_lr_ratio=0.1))
  np.testing.assert_allclose([lr(0), lr(9)], [1e-3, 1e-4], rtol=1e-6)


def test_a_lowered_peak_scales_the_schedule_from_its_step_on_and_leaves_it_before():
  base = O.OptimizerConfig(lr=1e-3, total_steps=100, warmup_steps=10)
  changed = O.OptimizerConfig(lr=1e-3, total_steps=100, warmup_steps=10, lr_changes=((40, 2e-4),))
  before, after = O.schedule(base), O.schedule(changed)
  np.testing.assert_allclose([after(c) for c in range(40)], [before(c) for c in range(40)], rtol=1e-6)
  np.testing.assert_allclose([after(c) for c in range(40, 100)], [0.2 * before(c) for c in range(40, 100)], rtol=1e-6)


def test_optimizer_defaults_and_weight_decay_on_matrices_only():
  defaults = O.OptimizerConfig()
  assert (defaults.b1, defaults.b2, defaults.weight_decay, defaults.clip_norm) == (0.9, 0.95, 0.1, 1.0)
  cfg = O.OptimizerConfig(lr=1.0, total_steps=10, warmup_steps=0, weight_decay=0.5)
  tx = O.make_optimizer(cfg)
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  assert isinstance(updates, dict)
  np.testing.assert_allclose(np.asarray(updates["w"]), -0.5 * params["w"])  # decoupled decay at lr 1
  np.testing.assert_allclose(np.asarray(updates["scale"]), 0.0)  # norm scales are not decayed


@pytest.mark.parametrize("field, value", [("lr", 0.0), ("warmup_steps", 500), ("b2", 1.0), ("clip_norm", 0.0)])
def test_invalid_optimizer_config_is_rejected_naming_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    fields: dict[str, Any] = {"warmup_steps": 10, field: value}
    O.OptimizerConfig(total_steps=100, **fields)


def test_a_learning_rate_passed_at_run_time_gives_the_scheduled_step():
  """make_train_step(..., lr_schedule=None) with tx at unit rate and lr = schedule(step) as an
  argument trains like the scheduled step (AdamW's last transformation is the rate). One layer: the
  property is the optimizer's, and each extra layer only adds compile time to both programs."""
  cfg = M.preset("tiny", recipe="s3r_ec_dx", layers=1)
  ocfg = O.OptimizerConfig(lr=3e-3, total_steps=6, warmup_steps=2)
  unit = O.OptimizerConfig(lr=1.0, total_steps=6, warmup_steps=0, final_lr_ratio=1.0)
  scheduled, init = _step_and_state(cfg, ocfg)
  runtime = jax.jit(St.make_train_step(M.graphdef(cfg), O.make_optimizer(unit), lr_schedule=None))
  scheduled = jax.jit(scheduled)
  tokens = jax.random.randint(jax.random.key(3), (2, 17), 0, cfg.vocab_size)
  a = init(jax.random.key(0))
  b = St.init_state(M.init_params(cfg, jax.random.key(0)), O.make_optimizer(unit))
  lr_at = O.schedule(ocfg)
  for step in range(4):
    a, ma = scheduled(a, tokens, jax.random.key(1))
    b, mb = runtime(b, tokens, jax.random.key(1), jnp.float32(lr_at(step)))
    assert float(ma["lr"]) == float(mb["lr"])
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-9)
  initial = init(jax.random.key(0)).params["embed"]
  assert not np.array_equal(np.asarray(a.params["embed"]), np.asarray(initial))  # it trained
