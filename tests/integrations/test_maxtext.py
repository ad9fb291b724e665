"""s3r as a MaxText quantization backend, on tiny MaxText models (needs MaxText: `pip install 's3r[maxtext]'`).

Every test here builds or runs MaxText (its import alone takes seconds), so all are `slow`:
    python -m pytest -m slow tests/integrations/test_maxtext.py
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("maxtext")
pytestmark = pytest.mark.slow

from flax import nnx  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.layers import linears, quantizations  # noqa: E402
from maxtext.utils import maxtext_utils_nnx, model_creation_utils  # noqa: E402

import s3r  # noqa: E402
from s3r.analysis import jaxpr as jaxpr_analysis  # noqa: E402
from s3r.integrations import maxtext as smt  # noqa: E402
from s3r.nn.dot_general import kernel_fingerprint  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
BASE_YML = str(pathlib.Path(pyconfig.__file__).parent / "base.yml")
LAYERS, B, S, VOCAB = 2, 2, 32, 256
PROJECTIONS_PER_LAYER = 7  # query, key, value, out; wi_0, wi_1, wo (logits_dense takes no quantization in MaxText)
TINY = dict(
  base_emb_dim=64,
  base_num_query_heads=2,
  base_num_kv_heads=2,
  head_dim=32,
  base_mlp_dim=128,
  base_num_decoder_layers=LAYERS,
  vocab_size=VOCAB,
  max_target_length=S,
  per_device_batch_size=B,
  attention="dot_product",
  dataset_type="synthetic",
  skip_jax_distributed_system=True,
  enable_tensorboard=False,
)


@pytest.fixture(scope="module", autouse=True)
def _registered():
  smt.register()


def _config(tmp_path, **overrides):
  kw = TINY | dict(run_name="s3r_test", base_output_directory=str(tmp_path), enable_checkpointing=False)
  return pyconfig.initialize(["", BASE_YML], **(kw | overrides))


def test_config_values_select_s3r_and_leave_maxtexts_own_values_to_it(tmp_path):
  quant = quantizations.configure_quantization(_config(tmp_path, quantization="s3r:int8_rtne"))
  assert isinstance(quant, smt.S3rQuantization) and quant.recipe.name == "int8_rtne"
  assert quantizations.configure_quantization(_config(tmp_path, quantization="s3r")).recipe.name == s3r.DEFAULT_RECIPE
  assert isinstance(
    quantizations.configure_quantization(_config(tmp_path, quantization="int8")), quantizations.AqtQuantization
  )
  with pytest.raises(ValueError, match="s3r:s3r_ecdx"):
    _config(tmp_path, quantization="s3r:s3r_ecdx")


def test_moe_config_raises_instead_of_leaving_the_experts_unquantized(tmp_path):
  cfg = _config(
    tmp_path, quantization="s3r", num_experts=4, num_experts_per_tok=2, base_moe_mlp_dim=TINY["base_mlp_dim"]
  )
  with pytest.raises(NotImplementedError, match="num_experts=4"):
    model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))


def _step_jaxpr(cfg):
  model = model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))
  tokens = jax.random.randint(jax.random.key(0), (B, S), 0, VOCAB)
  positions, segments = jnp.broadcast_to(jnp.arange(S), (B, S)), jnp.ones((B, S), jnp.int32)

  def loss(m):
    logits = m(decoder_input_tokens=tokens, decoder_positions=positions, decoder_segment_ids=segments)
    return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])

  graphdef, state = nnx.split(model)
  return jax.make_jaxpr(lambda st: nnx.value_and_grad(loss)(nnx.merge(graphdef, st)))(state)


@pytest.mark.parametrize(("recipe", "small"), [("s3r", 0), ("s3r_ec_dx", 1), ("bf16", None)])
def test_step_has_three_int8_gemms_per_quantized_projection(tmp_path, recipe, small):
  # remat_policy=minimal saves the projections' outputs, so no forward GEMM is recomputed in the backward;
  # s3r_ec_dx adds one small int8 dot per projection (its dX correction, [3B+1, N] rows)
  cfg = _config(tmp_path, quantization=f"s3r:{recipe}", scan_layers=False, remat_policy="minimal", enable_dropout=False)
  dots = jaxpr_analysis.int8_dots(_step_jaxpr(cfg))
  projections = LAYERS * PROJECTIONS_PER_LAYER
  if small is None:
    assert dots == []
    return
  gemms = [d for d in dots if all(v.aval.shape[0] != 3 * B + 1 for v in d.invars)]
  assert len(gemms) == 3 * projections
  assert len(dots) - len(gemms) == small * projections


class _Recorder:
  """Wraps the backend's `dot_general` to record each call's key and kernel (eager calls only)."""

  def __init__(self, monkeypatch):
    self.calls, original = [], smt.dot_general

    def recording(recipe, key, **kw):
      fn = original(recipe, key, **kw)

      def call(lhs, rhs, *args, **kwargs):
        self.calls.append((key, lhs, rhs))
        return fn(lhs, rhs, *args, **kwargs)

      return call

    monkeypatch.setattr(smt, "dot_general", recording)


def _dense(rngs, recipe="s3r_ec_dx"):
  quant = smt.S3rQuantization(recipe=s3r.recipe(recipe))
  return linears.DenseGeneral(
    in_features_shape=16, out_features_shape=(2, 8), kernel_axes=("embed", "heads", "kv"), quant=quant, rngs=rngs
  )


def test_dense_general_gradients_equal_qmatmuls_on_the_same_operands_and_key(monkeypatch):
  layer = _dense(nnx.Rngs(params=0, aqt=1))
  x = jax.random.normal(jax.random.key(2), (2, 4, 16), jnp.bfloat16)
  c = jax.random.normal(jax.random.key(3), (2, 4, 2, 8), jnp.float32)
  recorder = _Recorder(monkeypatch)
  y_layer = nnx.clone(layer)(x)  # an eager forward of a copy: the key and operands the next call uses
  ((key, lhs, rhs),) = recorder.calls  # DenseGeneral casts x to its dtype (float32) and the kernel likewise
  y_ref = s3r.qmatmul(lhs, rhs.reshape(16, 16), recipe="s3r_ec_dx").reshape(2, 4, 2, 8)
  np.testing.assert_array_equal(np.asarray(y_layer), np.asarray(y_ref))

  def layer_loss(layer, x):
    return jnp.sum(layer(x).astype(jnp.float32) * c)

  g_layer, g_x = nnx.grad(layer_loss, argnums=(0, 1))(layer, x)

  def ref_loss(kernel, x):
    w = kernel.astype(rhs.dtype).reshape(16, 16)
    y = s3r.qmatmul(x.astype(lhs.dtype), w, key=jax.random.fold_in(key, kernel_fingerprint(rhs)), recipe="s3r_ec_dx")
    return jnp.sum(y.reshape(2, 4, 2, 8).astype(jnp.float32) * c)

  r_kernel, r_x = jax.grad(ref_loss, argnums=(0, 1))(layer.kernel[...], x)
  np.testing.assert_array_equal(np.asarray(g_x, np.float32), np.asarray(r_x, np.float32))
  np.testing.assert_array_equal(np.asarray(g_layer.kernel[...]), np.asarray(r_kernel))


def test_keys_come_from_the_aqt_stream_fresh_per_call_and_per_layer(monkeypatch):
  rngs = nnx.Rngs(params=0, aqt=1)
  first, second = _dense(rngs), _dense(rngs)
  x = jax.random.normal(jax.random.key(2), (2, 4, 16), jnp.bfloat16)
  recorder = _Recorder(monkeypatch)
  first(x), first(x), second(x)
  keys = [np.asarray(jax.random.key_data(k)).tolist() for k, _, _ in recorder.calls]
  assert len({repr(k) for k in keys}) == 3
  again = nnx.Rngs(params=0, aqt=1)
  _dense(again)(x)  # the same seed gives the same key: keys are a function of the stream, not of the run
  assert np.asarray(jax.random.key_data(recorder.calls[-1][0])).tolist() == keys[0]


def _train(tmp_path, run_name, steps):
  """MaxText's own pre-training loop (`python -m s3r.integrations.maxtext`), s3r_ec_dx, checkpoints every 3 steps."""
  metrics = tmp_path / f"{run_name}-{steps}.jsonl"
  args = {
    **TINY,
    "run_name": run_name,
    "base_output_directory": str(tmp_path / "out"),
    "steps": steps,
    "learning_rate_schedule_steps": 9,  # the schedule of the 9-step run in every run (it defaults to `steps`)
    "enable_checkpointing": True,
    "checkpoint_period": 3,
    "async_checkpointing": False,
    "quantization": "s3r:s3r_ec_dx",
    "metrics_file": str(metrics),
  }
  cmd = [sys.executable, "-m", "s3r.integrations.maxtext", BASE_YML, *(f"{k}={v}" for k, v in args.items())]
  env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  return {int(r["step"]): r["learning/loss"] for r in rows if "learning/loss" in r}


def test_maxtext_trainer_trains_with_s3r_and_resumes_its_checkpoint_bit_for_bit(tmp_path):
  straight = _train(tmp_path, "straight", 9)
  first = _train(tmp_path, "resumed", 6)
  resumed = _train(tmp_path, "resumed", 9)  # restores step 5 (its last checkpoint), runs steps 6..8
  assert sorted(straight) == list(range(9)) and sorted(resumed) == [6, 7, 8]
  assert all(np.isfinite(v) for v in straight.values())
  assert straight[8] < straight[0]
  assert [first[s] for s in range(6)] == [straight[s] for s in range(6)]
  assert [resumed[s] for s in (6, 7, 8)] == [straight[s] for s in (6, 7, 8)]


def test_tensor_parallel_split_follows_maxtexts_logical_axis_rules(tmp_path, monkeypatch):
  # under the rules MaxText's train step runs with, q/k/v and wi_0/wi_1 split their output on `tensor`
  # (column-parallel) and out/wo their contraction (row-parallel), as in Megatron
  from flax.core import spmd

  cfg = _config(tmp_path, quantization="s3r", base_num_decoder_layers=1, scan_layers=False, enable_dropout=False)
  model = model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))
  kinds, original = [], smt.tensor_parallel_kind
  monkeypatch.setattr(smt, "tensor_parallel_kind", lambda *a, **k: kinds.append(original(*a, **k)) or kinds[-1])
  tokens = jnp.zeros((B, S), jnp.int32)
  with jax.set_mesh(model.mesh), spmd.logical_axis_rules(cfg.logical_axis_rules):
    model(decoder_input_tokens=tokens, decoder_positions=jnp.broadcast_to(jnp.arange(S), (B, S)))
  assert kinds == ["column", "column", "column", "row", "column", "column", "row"]
