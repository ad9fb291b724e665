"""s3r as a MaxText quantization backend, on tiny MaxText models (needs MaxText: `pip install 's3r[maxtext]'`).

Every test here builds or runs MaxText (its import alone takes seconds), so all are `slow`:
    python -m pytest -m slow tests/integrations/test_maxtext.py
"""

import collections
import json
import os
import pathlib
import re
import shlex
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
from labtools.analysis import jaxpr as jaxpr_analysis  # noqa: E402
from labtools.analysis.jaxpr import shaped  # noqa: E402
from s3r.integrations import maxtext as smt  # noqa: E402
from s3r.nn.dot_general import kernel_fingerprint  # noqa: E402
from tests.conftest import xla_flags  # noqa: E402

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


EXPERTS, TOP_K = 4, 2
MOE = dict(
  decoder_block="mixtral", num_experts=EXPERTS, num_experts_per_tok=TOP_K, base_moe_mlp_dim=TINY["base_mlp_dim"]
)


def test_moe_paths_the_s3r_backend_does_not_cover_raise_when_the_model_is_built(tmp_path):
  cfg = _config(tmp_path, quantization="s3r", **MOE, sparse_matmul=False)
  with pytest.raises(NotImplementedError, match=r"num_experts=4: sparse_matmul=False .* not wired to s3r"):
    model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))
  cfg = _config(tmp_path, quantization="s3r", **MOE, megablox=False)
  with pytest.raises(NotImplementedError, match=r"num_experts=4: megablox=False runs the experts through jax.lax"):
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
  gemms = [d for d in dots if all(shaped(v).shape[0] != 3 * B + 1 for v in d.invars)]
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


def _int8_dots_by_place(jaxpr, in_shard_map=False, counts=None):
  """int8 GEMMs of a step program that run on this platform: {"experts": inside MaxText's MoE `shard_map`,
  "dense": elsewhere}. s3r's "auto" grouped GEMM is a `platform_dependent` choice between the Pallas
  kernels (the CUDA branch) and the tiled XLA GEMMs (elsewhere); the kernels' bodies are not counted."""
  from jax.extend import core

  counts = {"experts": 0, "dense": 0} if counts is None else counts
  for eqn in (jaxpr.jaxpr if isinstance(jaxpr, core.ClosedJaxpr) else jaxpr).eqns:
    if jaxpr_analysis.is_int8_dot(eqn):
      counts["experts" if in_shard_map else "dense"] += 1
    if eqn.primitive.name == "pallas_call":
      continue
    for param in eqn.params.values():
      for sub in jaxpr_analysis._sub_jaxprs(param):
        _int8_dots_by_place(sub, in_shard_map or eqn.primitive.name == "shard_map", counts)
  return counts


@pytest.mark.parametrize(("recipe", "small"), [("s3r", 0), ("s3r_ec_dx", 1), ("bf16", None)])
def test_moe_step_runs_the_expert_gemms_in_int8(tmp_path, recipe, small):
  # Per MoE layer: the forward grouped GEMMs of wi_0, wi_1 and wo (3), the backward's dX and dW of each (6) and,
  # for s3r_ec_dx, one small batched int8 product per GEMM (the dX correction, 3). remat_policy=minimal saves
  # wi_0's and wo's outputs but not wi_1's (MaxText names it only "moe_mlpwi_1"), so wi_1's forward GEMM runs
  # again in the backward (1). The dense hook keeps the attention projections and the router's gate.
  cfg = _config(
    tmp_path, quantization=f"s3r:{recipe}", scan_layers=False, remat_policy="minimal", enable_dropout=False, **MOE
  )
  counts = _int8_dots_by_place(_step_jaxpr(cfg))
  if small is None:
    assert counts == {"experts": 0, "dense": 0}
    return
  assert counts["experts"] == LAYERS * (3 + 1 + 6 + 3 * small)
  assert counts["dense"] >= LAYERS * 5 * 3  # q, k, v, out and the gate: forward, dX and dW each


class _ExpertTap:
  """Wraps the backend's `expert_gmm` to fetch each expert GEMM's operands, key, output and output cotangent
  from the run: they live inside MaxText's `shard_map`, so they come out through callbacks. `calls[i][name]`
  lists the values of traced call i, one per execution (a rematerialized forward may add repeats)."""

  def __init__(self, monkeypatch):
    self.calls, original = [], smt.expert_gmm

    def tapped(lhs, rhs, group_sizes, *, recipe, key, preferred_element_type=None):
      record = collections.defaultdict(list)
      self.calls.append(record)

      def keep(name, value):
        jax.debug.callback(lambda v: record[name].append(np.asarray(v)), value)

      keep("lhs", lhs), keep("rhs", rhs), keep("group_sizes", group_sizes), keep("key", jax.random.key_data(key))
      out = original(lhs, rhs, group_sizes, recipe=recipe, key=key, preferred_element_type=preferred_element_type)
      keep("out", out)

      @jax.custom_vjp
      def tap(y):
        return y

      def tap_bwd(_, g):
        keep("g", g)
        return (g,)

      tap.defvjp(lambda y: (y, None), tap_bwd)
      return tap(out)

    monkeypatch.setattr(smt, "expert_gmm", tapped)


def _moe_model(tmp_path, recipe="s3r_ec_dx"):
  cfg = _config(
    tmp_path, quantization=f"s3r:{recipe}", scan_layers=False, remat_policy="minimal", enable_dropout=False, **MOE
  )
  return model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))


def _moe_loss(model):
  tokens = jax.random.randint(jax.random.key(0), (B, S), 0, VOCAB)
  positions, segments = jnp.broadcast_to(jnp.arange(S), (B, S)), jnp.ones((B, S), jnp.int32)
  logits = model(decoder_input_tokens=tokens, decoder_positions=positions, decoder_segment_ids=segments)
  return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])


def test_expert_gradient_equals_grouped_qmatmuls_on_the_same_operands_and_key(tmp_path, monkeypatch):
  model = _moe_model(tmp_path)
  tap = _ExpertTap(monkeypatch)
  grads = nnx.grad(_moe_loss)(model)
  jax.effects_barrier()
  assert len(tap.calls) == LAYERS * 3  # wi_0, wi_1, wo of each layer, in that order
  wi_0 = tap.calls[0]  # layer 0's wi_0: the kernel is cast to MaxText's dtype (bf16) for its gmm
  key = jax.random.wrap_key_data(jnp.asarray(wi_0["key"][0]))
  lhs, rhs, group_sizes = (jnp.asarray(wi_0[n][0]) for n in ("lhs", "rhs", "group_sizes"))
  assert int(group_sizes.sum()) == B * S * TOP_K

  def ref(w):
    k = jax.random.fold_in(key, kernel_fingerprint(rhs))
    return s3r.grouped_qmatmul(lhs, w.astype(rhs.dtype), group_sizes.astype(jnp.int32), key=k, recipe="s3r_ec_dx")

  out, vjp = jax.vjp(ref, model.decoder.layers_0.MoeBlock_0.wi_0[...])
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(wi_0["out"][0], np.float32))
  (dw,) = vjp(jnp.asarray(wi_0["g"][0]).astype(out.dtype))
  np.testing.assert_array_equal(np.asarray(grads.decoder.layers_0.MoeBlock_0.wi_0[...]), np.asarray(dw))


def test_expert_keys_come_from_the_aqt_stream_fresh_per_step_and_per_layer(tmp_path, monkeypatch):
  model = _moe_model(tmp_path)
  tap = _ExpertTap(monkeypatch)
  step = nnx.jit(lambda m: _moe_loss(m))
  step(model), step(model)  # the model's aqt stream count advances with every call, as in MaxText's train step
  jax.effects_barrier()
  gemms = LAYERS * 3  # each trace calls wi_0, wi_1, wo of each layer (nnx.jit may trace the model twice)
  assert tap.calls and len(tap.calls) % gemms == 0
  runs = [[k for c in tap.calls[g::gemms] for k in c["key"]] for g in range(gemms)]
  keys = [list(dict.fromkeys(k.tobytes() for k in run)) for run in runs]  # distinct, in run order
  assert all(len(k) == 2 for k in keys)  # a new key in the second step
  layers = [keys[3 * i] for i in range(LAYERS)]
  assert all(keys[3 * i + j] == layers[i] for i in range(LAYERS) for j in (1, 2))  # one draw per layer call
  assert len({k for layer in layers for k in layer}) == 2 * LAYERS  # (its GEMMs fold in their kernel's fingerprint)


def _train(tmp_path, run_name, steps, devices=1, **overrides):
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
  } | overrides
  cmd = [sys.executable, "-m", "s3r.integrations.maxtext", BASE_YML, *(f"{k}={v}" for k, v in args.items())]
  env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  if devices > 1:
    env["XLA_FLAGS"] = xla_flags(f"--xla_force_host_platform_device_count={devices}")
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


def test_maxtext_trainer_trains_a_moe_model_with_s3r_and_resumes_it_bit_for_bit(tmp_path):
  straight = _train(tmp_path, "moe", 9, **MOE)
  _train(tmp_path, "moe_resumed", 6, **MOE)
  resumed = _train(tmp_path, "moe_resumed", 9, **MOE)  # restores step 5: the expert keys' stream resumes too
  assert sorted(straight) == list(range(9)) and all(np.isfinite(v) for v in straight.values())
  assert straight[8] < straight[0]
  assert [resumed[s] for s in (6, 7, 8)] == [straight[s] for s in (6, 7, 8)]


def test_maxtext_trains_a_moe_model_with_s3r_on_two_devices(tmp_path):
  # MaxText's default mesh puts both devices on `fsdp`: the tokens split over it inside the MoE shard_map,
  # each shard a grouped product of its own with a key of its own (smt.shard_key); the INT8 forward does
  # not depend on the split, so the first step's loss is the one-device run's on the same global batch
  kw = dict(enable_checkpointing=False, learning_rate_schedule_steps=6, **MOE)
  one = _train(tmp_path, "moe1", 6, per_device_batch_size=2, **kw)
  two = _train(tmp_path, "moe2", 6, devices=2, per_device_batch_size=1, **kw)
  assert sorted(two) == list(range(6)) and all(np.isfinite(v) for v in two.values())
  assert two[0] == pytest.approx(one[0], rel=1e-6)
  assert two[5] < two[0]
  # tensor parallelism instead: the projections and experts split their widths over `tensor`
  tp = _train(tmp_path, "moe_tp", 6, devices=2, ici_fsdp_parallelism=1, ici_tensor_parallelism=2, **kw)
  assert sorted(tp) == list(range(6)) and all(np.isfinite(v) for v in tp.values()) and tp[5] < tp[0]


def test_maxtext_trains_a_moe_model_with_s3r_under_expert_parallelism_by_the_ring_of_experts(tmp_path):
  # two devices on `expert`: every shard gathers the tokens and runs its own two experts' grouped products;
  # the ring's output reduction runs in another order than the one-device sum, which moves MaxText's own bf16
  # model too, so the INT8 forward may differ between the meshes by no more than that
  kw = dict(enable_checkpointing=False, learning_rate_schedule_steps=6, **MOE)
  ep = dict(devices=2, per_device_batch_size=1, ici_fsdp_parallelism=1, ici_expert_parallelism=2)
  ep |= dict(use_ring_of_experts=True)
  one = _train(tmp_path, "ep_one", 6, per_device_batch_size=2, **kw)
  two = _train(tmp_path, "ep_two", 6, **ep, **kw)
  assert sorted(two) == list(range(6)) and all(np.isfinite(v) for v in two.values()) and two[5] < two[0]
  bf16_one = _train(tmp_path, "ep_bf16_one", 1, per_device_batch_size=2, **(kw | dict(quantization="")))
  bf16_two = _train(tmp_path, "ep_bf16_two", 1, **ep, **(kw | dict(quantization="")))
  assert abs(two[0] - one[0]) <= 2 * abs(bf16_two[0] - bf16_one[0]) + 1e-6 * abs(one[0])


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


def test_device_maxtext_script_dry_run_brings_back_the_bench_of_the_sliced_llama(tmp_path):
  # the device script at the tiniest size: MaxText's own llama3.1-8b config, shrunk to width 64 and a
  # 512-token vocabulary, one layer; no wheels to install (MaxText is here), versions-only smoke stage
  import tarfile

  tokens = tmp_path / "tokens"
  tokens.mkdir()
  rng = np.random.default_rng(0)
  for name, size in (("train", 6000), ("val", 600)):
    np.save(tokens / f"{name}.npy", rng.integers(0, 512, size).astype(np.uint16))
  out, work = tmp_path / "out", tmp_path / "work"
  env = os.environ | {"PY": sys.executable, "OUT": str(out), "WORK": str(work), "JAX_PLATFORMS": "cpu"}
  env |= {"SMOKE_STAGES": "versions", "TOKENS": str(tokens), "WHEELS": str(tmp_path / "none"), "LAYERS": "1"}
  env |= {"WIDTH": "64", "VOCAB": "512", "BATCH": "2", "SEQ": "32", "STEPS": "3", "SKIP": "1"}
  proc = subprocess.run(
    ["bash", "scripts/device_maxtext.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
  )
  assert proc.returncode == 0, proc.stdout[-4000:]
  assert sorted(p.name for p in out.iterdir()) == ["device_maxtext.log", "device_maxtext.tar.gz"]
  with tarfile.open(out / "device_maxtext.tar.gz") as tar:
    names = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
    member = tar.extractfile("./bench_maxtext_llama3.1-8b_cpu.json")
    assert member is not None
    doc = json.load(member)
  assert {"smoke/smoke.json", "bench_maxtext_llama3.1-8b_cpu.md"} <= names
  assert doc["complete"] and doc["settings"]["model_config"]["model_name"] == "llama3.1-8b"
  assert set(doc["results"]) == {"none", "int8", "s3r:bf16", "s3r:s3r_ec_dx"}
  assert all(r["steps_run"] == 3 and np.isfinite(r["val_loss"]) for r in doc["results"].values())


def test_the_documented_cpu_command_trains_a_tiny_model(tmp_path):
  """docs/maxtext.md's tiny run on a CPU, as written there: MaxText's base.yml for its placeholder, a temporary
  output folder, and a metrics file to read the losses from."""
  doc = (REPO / "docs" / "maxtext.md").read_text()
  found = re.search(r"^### A tiny run on a CPU\n.*?```bash\n(.*?)```", doc, flags=re.S | re.M)
  assert found is not None, "docs/maxtext.md has its CPU example"
  words = shlex.split(found.group(1).replace("\\\n", " "))
  assert words[:5] == ["JAX_PLATFORMS=cpu", "python", "-m", "s3r.integrations.maxtext", "maxtext/configs/base.yml"]
  args = {k: v for k, _, v in (w.partition("=") for w in words[5:])}
  assert args["skip_jax_distributed_system"] == "True" and args["hardware"] == "cpu"
  args |= {"base_output_directory": str(tmp_path / "out"), "metrics_file": str(tmp_path / "metrics.jsonl")}
  cmd = [sys.executable, "-m", "s3r.integrations.maxtext", BASE_YML, *(f"{k}={v}" for k, v in args.items())]
  env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a plain machine
  proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses = [r["learning/loss"] for r in rows if "learning/loss" in r]
  assert len(losses) == int(args["steps"]) and all(np.isfinite(losses)) and losses[-1] < losses[0]
