"""Gradient accumulation (--grad-accum N): the same global batch in N microbatches, their f32 gradients summed by a
scan; numbers against the one-batch step, keys per microbatch, exact resume and the data order of the loop."""

import dataclasses
import json
import shutil
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s3r import model as M
from s3r.train import loop
from s3r.train import step as St
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import checkpoint
from s3r.train.step import optimizer as O
from tests.train.conftest import tiny_config

U_BF16 = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits, round to nearest)
U_F32 = 2.0**-24


def _grads(cfg, tokens, key, n):
  """(one-batch loss, grads), (accumulated loss, grads) and the one-batch grads of each microbatch."""
  graphdef, params = M.graphdef(cfg), M.init_params(cfg, jax.random.key(0))
  value_and_grad = jax.jit(lambda p, b, k: jax.value_and_grad(St.training_loss_fn, has_aux=True)(p, graphdef, b, k))
  (_, (loss, _)), grads = value_and_grad(params, tokens, key)
  acc_loss, _, acc_grads = jax.jit(lambda p, b, k: St.accumulated_grads(p, graphdef, b, k, n))(params, tokens, key)
  micro = St.microbatches(tokens, n)
  per_micro = [value_and_grad(params, micro[m], key)[1] for m in range(n)]
  return (loss, grads), (acc_loss, acc_grads), per_micro


def test_grad_accum_equals_one_batch_for_bf16_to_f32_rounding():
  """The forward is row by row, so both steps compute the same token losses and token gradients; only the sums over
  the K = B x S tokens run in another order. Loss: two f32 sums of the same K positive terms, each within
  (K - 1) u_f32 of the exact mean. A projection's weight gradient (f32 accumulation in the bf16 recipe) and a norm
  scale's: two f32 sums of the same K terms, so at most 2 K u_f32 times the terms' magnitude, taken here as
  |full| + the mean over microbatches of |g_m| (at most the sum of the terms' magnitudes, so this bound is the
  tighter one). The logits weight enters its GEMM in bf16, so its gradient is rounded to bf16 once per microbatch
  and once in the full step: within u_bf16 of that magnitude. The embedding's gradient is left out: it is a bf16
  scatter-add, where repeated tokens' terms cancel, and its error has no bound in the result's size."""
  cfg, n = M.preset("tiny", recipe="bf16"), 4
  tokens = jax.random.randint(jax.random.key(3), (8, 33), 0, cfg.vocab_size)
  (loss, grads), (acc_loss, acc_grads), per_micro = _grads(cfg, tokens, jax.random.key(1), n)
  k = tokens.shape[0] * (tokens.shape[1] - 1)
  assert abs(float(acc_loss) - float(loss)) <= 2 * (k - 1) * U_F32 * float(loss)
  checked = []
  for (path, full), acc, *micro in zip(
    jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(acc_grads), *map(jax.tree.leaves, per_micro)
  ):
    name = jax.tree_util.keystr(path)
    if name == "['embed']":
      continue
    full, acc = np.asarray(full, np.float64), np.asarray(acc, np.float64)
    magnitude = np.abs(full) + sum(np.abs(np.asarray(m, np.float64)) for m in micro) / n
    bound = U_BF16 * magnitude if name == "['out']" else 2 * k * U_F32 * magnitude
    assert np.all(np.abs(acc - full) <= bound), name
    checked.append(name)
  assert len(checked) == len(jax.tree.leaves(grads)) - 1 and "['layers']['q']" in checked


def test_microbatches_split_every_devices_rows_evenly_and_keep_every_row_once():
  batch = jnp.arange(8 * 3).reshape(8, 3)
  micro = np.asarray(St.microbatches(batch, 2))
  assert micro.shape == (2, 4, 3)
  np.testing.assert_array_equal(micro[0], np.asarray(batch)[0::2])  # rows 0, 2, 4, 6
  np.testing.assert_array_equal(micro[1], np.asarray(batch)[1::2])
  # two data-parallel devices hold rows 0-3 and 4-7: each microbatch has two rows of each
  assert {int(r) // 3 // 4 for r in micro[0][:, 0]} == {0, 1}


def test_each_microbatch_gets_its_own_key_and_none_is_the_step_key():
  step_key = jax.random.fold_in(jax.random.key(1), 7)
  keys = St.microbatch_keys(step_key, 4)
  data = {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in keys}
  layer_keys = {tuple(np.asarray(jax.random.key_data(jax.random.fold_in(step_key, i))).tolist()) for i in range(4)}
  assert len(data) == 4 and not data & layer_keys  # distinct, and none is a key the one-batch step's layers use
  assert tuple(np.asarray(jax.random.key_data(step_key)).tolist()) not in data
  again = St.microbatch_keys(step_key, 2)  # the key of microbatch m does not depend on N
  assert np.array_equal(jax.random.key_data(again), jax.random.key_data(keys[:2]))


def test_a_stochastic_recipe_draws_each_microbatchs_noise_from_its_own_key():
  """Two identical microbatches: with one key each, S3R's stochastic gradient codes differ between them, so the
  accumulated gradient is not the gradient of one of them (it would be, bit for bit, under a shared key)."""
  cfg = M.preset("tiny", recipe="s3r", layers=1)
  half = jax.random.randint(jax.random.key(3), (2, 17), 0, cfg.vocab_size)
  tokens = jnp.stack([half, half], axis=1).reshape(4, 17)  # microbatches of rows 0, 2 and 1, 3: the same rows
  assert np.array_equal(np.asarray(St.microbatches(tokens, 2)[0]), np.asarray(St.microbatches(tokens, 2)[1]))
  graphdef, params = M.graphdef(cfg), M.init_params(cfg, jax.random.key(0))
  _, _, acc = jax.jit(lambda p, b, k: St.accumulated_grads(p, graphdef, b, k, 2))(params, tokens, jax.random.key(1))
  keys = St.microbatch_keys(jax.random.key(1), 2)
  grad = jax.jit(jax.grad(lambda p, b, k: St.training_loss_fn(p, graphdef, b, k)[0]))
  g0, g1 = grad(params, half, keys[0]), grad(params, half, keys[1])
  assert not np.array_equal(np.asarray(g0["layers"]["q"]), np.asarray(g1["layers"]["q"]))
  mean = (np.asarray(g0["layers"]["q"]) + np.asarray(g1["layers"]["q"])) / 2
  np.testing.assert_allclose(np.asarray(acc["layers"]["q"]), mean, rtol=1e-5, atol=1e-7)


def test_grad_accum_1_traces_the_plain_step_unchanged():
  """N = 1 is the one-batch step itself: the same program as value_and_grad on the whole batch with the step key."""
  cfg = M.preset("tiny", recipe="s3r", layers=1)
  ocfg = O.OptimizerConfig(total_steps=10, warmup_steps=2)
  tx, graphdef = O.make_optimizer(ocfg), M.graphdef(cfg)
  lr = O.schedule(ocfg)

  def plain(state, batch, train_key):
    step_key = jax.random.fold_in(train_key, state.step)
    (_, (loss, aux)), grads = jax.value_and_grad(St.training_loss_fn, has_aux=True)(
      state.params, graphdef, batch, step_key
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params, rate = cast(dict, optax.apply_updates(state.params, updates)), lr(state.step)
    norm, nonfinite = optax.tree.norm(grads), St.first_nonfinite(grads)
    metrics = {"loss": loss, "grad_norm": norm, St.FIRST_NONFINITE_GRAD: nonfinite, "lr": rate, **aux}
    return St.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  state = jax.eval_shape(lambda k: St.init_state(M.init_params(cfg, k), tx), jax.random.key(0))
  args = (state, jax.ShapeDtypeStruct((4, 17), jnp.int32), jax.random.key(1))
  one = St.make_train_step(graphdef, tx, lr, grad_accum=1)
  assert str(jax.make_jaxpr(one)(*args)) == str(jax.make_jaxpr(plain)(*args))
  with pytest.raises(ValueError, match="grad_accum"):
    St.make_train_step(graphdef, tx, lr, grad_accum=0)


@pytest.mark.parametrize("fields, text", [({"batch": 6, "grad_accum": 4}, "--grad-accum=4"), ({"grad_accum": 0}, "")])
def test_a_batch_that_does_not_split_into_the_microbatches_is_refused_naming_the_flags(fields, text):
  with pytest.raises(ConfigError) as e:
    TrainConfig(out="run", preset="tiny", **fields)
  assert "--batch" in str(e.value) or "--grad-accum" in str(e.value)
  assert text in str(e.value) and "\n" not in str(e.value)


def test_microbatches_that_do_not_split_over_the_data_parallel_devices_are_refused_naming_both_flags():
  from types import SimpleNamespace

  from s3r.train.builder import check_microbatches

  mesh: Any = SimpleNamespace(shape={"data": 2, "expert": 1, "fsdp": 2, "tensor": 2})  # 4 data-parallel devices
  check_microbatches(TrainConfig(out="run", preset="tiny", batch=16, grad_accum=4), mesh)  # 4 rows per device
  with pytest.raises(ConfigError) as e:
    check_microbatches(TrainConfig(out="run", preset="tiny", batch=8, grad_accum=4), mesh)
  message = str(e.value)
  assert message.startswith("--batch 8 must be divisible by --grad-accum 4 x data x expert x fsdp = 16")
  assert "\n" not in message


def _records(cfg):
  return [json.loads(line) for line in open(f"{cfg.out}/metrics.jsonl")]


def _quiet(*_):
  pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir, cache_dir):
  """Two 4-step runs of S3R on `tiny` (checkpoints at 2 and 4): one batch per step, and 2 microbatches per step."""
  run = dict(recipe="s3r", steps=4, warmup=1, eval_every=4, ckpt_every=2)
  out = tmp_path_factory.mktemp("grad_accum")
  one = tiny_config(out / "one", corpus_dir, cache_dir, **run)
  two = tiny_config(out / "two", corpus_dir, cache_dir, **run, grad_accum=2)
  loop.train(one, log=_quiet)
  loop.train(two, log=_quiet)
  return one, two


def test_grad_accum_run_reads_the_same_global_batches_in_the_same_order(runs):
  one, two = runs
  a, b = _records(one), _records(two)
  assert a[0]["loss"] == b[0]["loss"]  # step 0: the same first batch and parameters
  # step 1: the same batch and parameters; the forward is row by row (S3R's forward is deterministic), so the
  # losses are two f32 means of the same 128 positive token losses: within 2 x 127 u_f32 of each other
  assert abs(a[1]["loss"] - b[1]["loss"]) <= 2 * 127 * U_F32 * a[1]["loss"]
  ckpts = [checkpoint.Checkpointer(f"{cfg.out}/checkpoints", create=False) for cfg in runs]
  try:
    for step in (2, 4):
      assert ckpts[0].read_meta(step)["loader"] == ckpts[1].read_meta(step)["loader"]
  finally:
    for c in ckpts:
      c.close()
  assert json.load(open(f"{two.out}/config.json"))["train"]["grad_accum"] == 2


def test_grad_accum_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run_bitwise(runs, tmp_path):
  _, two = runs
  full = _records(two)
  copy = dataclasses.replace(two, out=str(tmp_path / "copy"), resume=True)
  shutil.copytree(two.out, copy.out)
  shutil.rmtree(f"{copy.out}/checkpoints/4")  # stopped after step 2
  loop.train(copy, log=_quiet)
  resumed = _records(copy)
  for key in ("loss", "grad_norm", "lr", "val_loss"):
    assert [r.get(key) for r in resumed] == [r.get(key) for r in full], key
  with pytest.raises(ConfigError, match="--grad-accum"):  # another N changes the numbers: refused on --resume
    loop.train(dataclasses.replace(copy, grad_accum=1), log=_quiet)
