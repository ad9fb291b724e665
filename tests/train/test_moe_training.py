"""Training MoE models: the load-balancing loss enters the training loss (not the validation loss),
every recipe trains, and a `moe-tiny` run logs the MoE metrics and resumes bit for bit."""

import dataclasses
import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import s3r
from s3r import model as M
from s3r.train import loop
from s3r.train import step as St
from s3r.train.step import optimizer as O
from tests.train.conftest import tiny_config

MOE_METRICS = ("load_balance_loss", "dropped_fraction")


def _micro(recipe, **overrides):
  """moe-tiny cut to one layer of width 32 (cheap to compile)."""
  return M.preset(
    "moe-tiny",
    recipe=recipe,
    layers=1,
    width=32,
    d_head=8,
    n_heads=4,
    n_kv_heads=2,
    d_expert=16,
    vocab_size=64,
    **overrides,
  )


def _step(cfg, ocfg=O.OptimizerConfig(lr=3e-3, total_steps=20, warmup_steps=0)):
  tx = O.make_optimizer(ocfg)
  return jax.jit(St.make_train_step(M.graphdef(cfg), tx, O.schedule(ocfg))), St.init_state(
    M.init_params(cfg, jax.random.key(0)), tx
  )


def _batch(vocab, b=4, s=16, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (b, s + 1)), jnp.int32)


def _losses(cfg, batch):
  """(training loss, (cross-entropy, aux)) and the eval loss of cfg's initial parameters, jitted."""
  graphdef, params = M.graphdef(cfg), M.init_params(cfg, jax.random.key(0))
  train = jax.jit(lambda p, b: St.training_loss_fn(p, graphdef, b, None))
  return train(params, batch), float(jax.jit(lambda p, b: St.loss_fn(p, graphdef, b, None))(params, batch))


def test_training_loss_adds_the_load_balancing_loss_and_the_eval_loss_does_not():
  cfg = _micro("bf16", aux_loss_weight=0.5, capacity_factor=0.5)
  (total, (ce, aux)), eval_loss = _losses(cfg, _batch(cfg.vocab_size))
  assert set(aux) == set(MOE_METRICS) and float(aux["load_balance_loss"]) > 0.4  # weight 0.5 x balance >= ~1
  assert float(total) == pytest.approx(float(ce) + float(aux["load_balance_loss"]), rel=1e-6)
  assert eval_loss == pytest.approx(float(ce), rel=1e-6)
  assert 0 < float(aux["dropped_fraction"]) < 1  # capacity 0.5: some assignments are dropped
  dense = M.preset("tiny", recipe="bf16", layers=1)
  (total, (ce, aux)), _ = _losses(dense, _batch(dense.vocab_size))
  assert aux == {} and float(total) == float(ce)


def test_the_load_balancing_gradient_reaches_the_router():
  batch = _batch(64)
  router_grad = lambda cfg: jax.jit(jax.grad(lambda p: St.training_loss_fn(p, M.graphdef(cfg), batch, None)[0]))(
    M.init_params(cfg, jax.random.key(0))
  )["layers"]["moe"]["router"][0]
  without, with_ = router_grad(_micro("bf16", aux_loss_weight=0.0)), router_grad(_micro("bf16", aux_loss_weight=1.0))
  assert float(jnp.linalg.norm(with_ - without)) > 0.1 * float(jnp.linalg.norm(without))


MAIN_RECIPES = ("bf16", "s3r_ec_dx")  # the others: slow (compile time; tests/quant covers their numerics)


@pytest.mark.parametrize(
  "recipe", [r if r in MAIN_RECIPES else pytest.param(r, marks=pytest.mark.slow) for r in s3r.RECIPES]
)
def test_every_recipe_trains_an_moe_model_with_finite_losses(recipe):
  cfg = _micro(recipe)
  step, state = _step(cfg)
  for i in range(2):
    state, metrics = step(state, _batch(cfg.vocab_size, seed=i), jax.random.key(7))
    assert all(math.isfinite(float(metrics[k])) for k in ("loss", "grad_norm", *MOE_METRICS)), (recipe, metrics)
  assert float(metrics["load_balance_loss"]) > 0 and float(metrics["dropped_fraction"]) == 0


def _records(cfg):
  return [json.loads(line) for line in open(f"{cfg.out}/metrics.jsonl")]


@pytest.mark.slow  # two MoE runs (40 s); dense resumption is bit-for-bit in tests/train/test_loop.py, MoE metrics are
# logged in tests/train/test_families_cli.py
def test_moe_run_logs_the_moe_metrics_and_resumes_bit_for_bit(tmp_path, corpus_dir, cache_dir):
  cfg = tiny_config(
    tmp_path / "run", corpus_dir, cache_dir, preset="moe-tiny", recipe="s3r", steps=4, warmup=1, batch=2, seq=16,
    eval_every=2, ckpt_every=2,
  )  # fmt: skip
  loop.train(cfg, log=lambda *_: None)
  full = _records(cfg)
  assert [r["step"] for r in full] == list(range(5))
  assert all(set(MOE_METRICS) <= set(r) for r in full[1:]) and set(MOE_METRICS).isdisjoint(full[0])
  copy = dataclasses.replace(cfg, out=str(tmp_path / "copy"), resume=True)
  shutil.copytree(cfg.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/4")
  loop.train(copy, log=lambda *_: None)
  resumed = _records(copy)
  for key in ("loss", "grad_norm", "val_loss", *MOE_METRICS):
    assert [r.get(key) for r in resumed] == [r.get(key) for r in full], key
