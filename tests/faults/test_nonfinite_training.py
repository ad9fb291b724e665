"""A NaN injected anywhere in a training step shows in its loss or its gradient norm, and the step
names the first parameter whose gradient is not finite (the guard reports it with the step).

Injection points: one element of any parameter (at a place the batch uses), the input of any block
projection, and the upstream gradient of any block projection, for the dense and the MoE (grouped)
model. The guard's message is checked end to end in tests/faults/test_messages.py's CLI cases.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.quant import recipes
from s3r.train import step as St
from s3r.train.run import guard
from s3r.train.step import optimizer as O

VOCAB, BATCH, SEQ = 64, 2, 32
# every token id is an input of the batch, so that a NaN in any embedding row is read by the step
_INPUTS = np.arange(BATCH * SEQ).reshape(BATCH, SEQ) % VOCAB
TOKENS = jnp.asarray(np.concatenate([_INPUTS, _INPUTS[:, :1]], axis=1), jnp.int32)
FAST_RECIPES = (recipes.DEFAULT_RECIPE,)
SLOW_RECIPES = tuple(recipes.RECIPES)


def _cfg(preset: str, recipe: str):
  extra = {"d_expert": 16, "n_experts": 2, "top_k": 2} if "moe" in preset else {}
  return M.preset(preset, recipe=recipe, layers=1, width=32, vocab_size=VOCAB, **extra)


def _step_and_state(cfg, block=None):
  ocfg = O.OptimizerConfig(lr=1e-3, total_steps=10, warmup_steps=0)
  tx = O.make_optimizer(ocfg)
  state = St.init_state(M.init_params(cfg, jax.random.key(0)), tx)
  return St.make_train_step(M.graphdef(cfg, block=block), tx, O.schedule(ocfg)), state


def _visible(metrics) -> bool:
  return not (math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"])))


def _named(metrics, params) -> str | None:
  return guard.param_name(params, int(metrics[St.FIRST_NONFINITE_GRAD]))


@functools.cache
def _compiled(preset: str, recipe: str):
  step, state = _step_and_state(_cfg(preset, recipe))
  return jax.jit(step), state


def _check_parameters(preset: str, recipe: str, values=(np.nan, np.inf)):
  step, state = _compiled(preset, recipe)
  metrics = step(state, TOKENS, jax.random.key(1))[1]
  assert not _visible(metrics) and int(metrics[St.FIRST_NONFINITE_GRAD]) == -1
  leaves, treedef = jax.tree.flatten(state.params)
  for i, leaf in enumerate(leaves):
    for bad in values:
      poisoned = list(leaves)
      poisoned[i] = leaf.reshape(-1).at[leaf.size // 2].set(bad).reshape(leaf.shape)
      params = jax.tree.unflatten(treedef, poisoned)
      metrics = step(state._replace(params=params), TOKENS, jax.random.key(1))[1]
      name = guard.param_name(params, i)
      assert _visible(metrics), f"{recipe}: {bad} in {name} is invisible: {metrics}"
      if not math.isfinite(float(metrics["grad_norm"])):
        assert _named(metrics, params) is not None, (recipe, name)


@pytest.mark.parametrize("preset", ["tiny", "moe-tiny"])
@pytest.mark.parametrize("recipe", FAST_RECIPES)
def test_a_nonfinite_parameter_shows_in_the_loss_or_gradient_norm(preset, recipe):
  _check_parameters(preset, recipe, values=(np.nan,))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "moe-tiny"])
@pytest.mark.parametrize("recipe", SLOW_RECIPES)
def test_a_nonfinite_parameter_shows_in_the_loss_or_gradient_norm_with_every_recipe(preset, recipe):
  if recipe in FAST_RECIPES:  # NaN ran in the default suite; Inf here
    _check_parameters(preset, recipe, values=(np.inf,))
    return
  _check_parameters(preset, recipe)


@jax.custom_vjp
def _poison_cotangent(y, where):
  return y


def _poison_fwd(y, where):
  return y, where


def _poison_bwd(where, g):
  return jnp.where(where, jnp.nan, g), None


_poison_cotangent.defvjp(_poison_fwd, _poison_bwd)


def _run_with_injection(cfg, target: str, place: str):
  """The step's metrics when projection `target`'s input (place "x") or upstream gradient ("g")
  gets one NaN (in every layer: the model is built with a block that injects it)."""

  class Injected(M.block_class(cfg)):
    def _proj(self, name, x, layer_key):
      if name == target and place == "x":
        x = x.at[(0,) * (x.ndim - 1) + (1,)].set(jnp.nan)
      y = super()._proj(name, x, layer_key)
      if name == target and place == "g":
        where = jnp.zeros(y.shape, bool).at[(0,) * (y.ndim - 1) + (1,)].set(True)
        y = _poison_cotangent(y, where)
      return y

  step, state = _step_and_state(cfg, block=Injected)
  metrics = jax.jit(step)(state, TOKENS, jax.random.key(1))[1]
  return metrics, state.params


@pytest.mark.parametrize("place", ["x", "g"])
@pytest.mark.parametrize("recipe", FAST_RECIPES)
def test_a_nan_in_a_projections_input_or_upstream_gradient_shows_in_the_step(recipe, place):
  _check_projections(recipe, place, targets=("down",))


@pytest.mark.slow
@pytest.mark.parametrize("place", ["x", "g"])
@pytest.mark.parametrize("recipe", [r for r in recipes.RECIPES if r not in FAST_RECIPES])
def test_a_nan_in_a_projections_input_or_upstream_gradient_shows_in_the_step_with_every_recipe(recipe, place):
  _check_projections(recipe, place)


def _check_projections(recipe: str, place: str, targets=("q", "k", "v", "o", "gate", "up", "down")):
  cfg = _cfg("tiny", recipe)
  for target in targets:
    metrics, params = _run_with_injection(cfg, target, place)
    assert _visible(metrics), (recipe, target, place, metrics)
    if place == "g":  # the forward is clean: the loss is finite and the gradient names a parameter
      assert math.isfinite(float(metrics["loss"])) and _named(metrics, params) is not None, metrics


def test_the_guard_names_the_step_and_the_first_nonfinite_gradient():
  monitor = guard.DivergenceMonitor(3.0)
  why = monitor.check(7, 2.9, float("nan"), "blocks/0/attn/wq")
  assert why is not None
  assert "non-finite gradient norm at step 7" in why and "first non-finite gradient: blocks/0/attn/wq" in why
  assert "non-finite loss at step 8" in (monitor.check(8, float("inf"), 1.0) or "")
