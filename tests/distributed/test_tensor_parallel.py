"""Tensor-parallel partial sums: rounded to bf16 per shard (the default, as in the paper) or exact.

Row-parallel projections (o, down) contract the tensor-split heads / MLP dim in the forward
pass, column-parallel ones (q, k, v, gate, up) in the dX product of the backward pass. With
`tp_partial_sums="bf16"` those GEMMs are split-K products whose t per-shard outputs are rounded
to bf16 and then summed (one bf16 all-reduce; XLA:CPU performs it in f32 on the bf16 values).
With "int32" the SPMD partitioner all-reduces each GEMM's int32 accumulator: exact, so the
result does not depend on the tensor-parallel degree (docs/scaling.md).
"""

import ml_dtypes
import numpy as np
import pytest

from tests.quant.reference import np_rtne_codes, np_scale

PROJECTIONS_PER_LAYER = 7  # q, k, v, o, gate, up, down
ROW_PARALLEL_PER_LAYER = 2  # o, down
LAYERS, D = 2, 64  # tiny
# the compiled step's collectives as written in the program: the scanned decoder's loop body holds one layer's
PROGRAM_LAYERS = 1
T = 8  # tensor-parallel degree of the tests
BF16_HALF_ULP = 2.0**-8  # relative rounding error of one round to bf16
F32_HALF_ULP = 2.0**-24


def _activation_all_reduces(run, dtype):
  """(op_name, shape) of the all-reduced buffers of one [tokens, D] activation over all 8 devices."""
  return [
    (c["op_name"], s)
    for c in run["collectives"]
    if c["kind"] == "all-reduce" and c["dtype"] == dtype and c["group_size"] == 8
    for s in c["shapes"]
    if len(s) > 1 and np.prod(s) == run["tokens"] * D and s[-1] == D
  ]


def test_exact_partial_sums_are_int32_accumulators(mesh_train_losses):
  run = mesh_train_losses["tensor=8:int32"]  # pure TP: every weight split over 8 devices, tokens replicated
  s32 = _activation_all_reduces(run, "s32")
  assert len(s32) == PROJECTIONS_PER_LAYER * PROGRAM_LAYERS, s32
  forward = [op for op, _ in s32 if "transpose" not in op]
  assert len(forward) == ROW_PARALLEL_PER_LAYER * PROGRAM_LAYERS, s32  # o and down in the forward pass
  assert not [c for c in run["collectives"] if c["dtype"] == "bf16"], "no collective runs in bf16"


def test_bf16_partial_sums_replace_every_int32_all_reduce_of_an_activation(mesh_train_losses):
  exact, rounded = mesh_train_losses["tensor=8:int32"], mesh_train_losses["tensor=8"]
  assert not _activation_all_reduces(rounded, "s32")
  floats = lambda run: len(_activation_all_reduces(run, "f32") + _activation_all_reduces(run, "bf16"))
  assert floats(rounded) - floats(exact) == PROJECTIONS_PER_LAYER * PROGRAM_LAYERS  # one per projection


def _split_sum_bound(parts_txMxN, got, ref):
  """|got - ref| bound for Σ_t parts summed in f32 (t-1 roundings) then rounded to bf16, against
  the f64 sum rounded to bf16: one bf16 rounding on each side plus the f32 sum's error."""
  return BF16_HALF_ULP * (np.abs(got) + np.abs(ref)) + (T - 1) * F32_HALF_ULP * np.abs(parts_txMxN).sum(0)


def _rounded_parts(acc_txMxN, scale):
  return (acc_txMxN.astype(np.float32) * scale).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_bf16_partial_sums_round_each_shard_output(tp_runs):
  a = tp_runs["arrays"]
  x, w = a["x"].reshape(-1, a["x"].shape[-1]), a["w"]
  sx, sw = np_scale(x, axis=1), np_scale(w, axis=0)
  xq, wq = np_rtne_codes(x, sx[:, None]).astype(np.int64), np_rtne_codes(w, sw[None, :]).astype(np.int64)
  k, n = w.shape
  # forward of a row-parallel weight (the same for every INT8 recipe): shard t holds K/T input features
  acc = np.stack([xq[:, i * k // T : (i + 1) * k // T] @ wq[i * k // T : (i + 1) * k // T] for i in range(T)])
  row_parts = ((acc.astype(np.float32) * sx[:, None]) * sw).astype(ml_dtypes.bfloat16).astype(np.float64)
  row_ref = row_parts.sum(0).astype(ml_dtypes.bfloat16).astype(np.float64)
  exact = ((xq @ wq).astype(np.float32) * sx[:, None] * sw).astype(ml_dtypes.bfloat16).astype(np.float64)
  for recipe in ("int8_rtne", "s3r"):
    got = a[f"{recipe}_row_y"].reshape(row_ref.shape)
    assert np.all(np.abs(got - row_ref) <= _split_sum_bound(row_parts, got, row_ref)), recipe
    np.testing.assert_array_equal(a[f"{recipe}_exact_y"].reshape(row_ref.shape), exact)
    assert np.mean(got != exact) > 0.01, "per-shard rounding must change some outputs"

    # dX of a column-parallel weight: shard t holds N/T output features of W and of Q
    q, delta = a[f"{recipe}_q"].reshape(-1, n).astype(np.int64), a[f"{recipe}_delta"]
    acc = np.stack([q[:, i * n // T : (i + 1) * n // T] @ wq[:, i * n // T : (i + 1) * n // T].T for i in range(T)])
    parts = _rounded_parts(acc, (delta / sx)[:, None])
    ref = parts.sum(0).astype(ml_dtypes.bfloat16).astype(np.float64)
    got = a[f"{recipe}_column_dx"].reshape(ref.shape)
    assert np.all(np.abs(got - ref) <= _split_sum_bound(parts, got, ref)), recipe
    assert np.mean(got != a[f"{recipe}_exact_dx"].reshape(ref.shape)) > 0.01


def test_the_bf16_recipe_rounds_each_shard_output_too(tp_runs):
  """The baseline gets the same per-shard rounding: f32-accumulated bf16 products per shard,
  rounded to bf16, summed. Beyond the int8 bound, each shard's f32 accumulation may round
  differently from the float64 reference (C/T terms, 2^-24 each), which can move that shard's
  bf16 rounding by one bf16 ulp."""
  a = tp_runs["arrays"]
  bf = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
  x, w, g = bf(a["x"].reshape(-1, a["x"].shape[-1])), bf(a["w"]), bf(a["g"].reshape(-1, a["w"].shape[1]))
  k, n = w.shape
  for name, lhs, rhs, c in (("row_y", x, w, k), ("column_dx", g, w.T, n)):
    exact = np.stack([lhs[:, i * c // T : (i + 1) * c // T] @ rhs[i * c // T : (i + 1) * c // T] for i in range(T)])
    mags = np.stack(
      [np.abs(lhs[:, i * c // T : (i + 1) * c // T]) @ np.abs(rhs[i * c // T : (i + 1) * c // T]) for i in range(T)]
    )
    parts = bf(exact)
    ref = bf(parts.sum(0))
    got = a[f"bf16_{name}"].reshape(ref.shape)
    accumulation = (c // T) * F32_HALF_ULP * mags + 2 * BF16_HALF_ULP * (np.abs(exact) + c // T * F32_HALF_ULP * mags)
    assert np.all(np.abs(got - ref) <= _split_sum_bound(parts, got, ref) + accumulation.sum(0)), name
    assert np.mean(got != a[f"bf16_exact_{name.split('_')[1]}"].reshape(ref.shape)) > 0.01, name


def test_ec_dx_under_column_parallelism_stays_within_the_rounding_of_the_exact_sum(tp_runs):
  """s3r_ec_dx subtracts its correction after the bf16 sum: the result differs from the exact
  (int32) path by the per-shard roundings, bounded by T+1 bf16 roundings of the largest part."""
  a = tp_runs["arrays"]
  got, exact = a["s3r_ec_dx_column_dx"], a["s3r_ec_dx_exact_dx"]
  assert np.isfinite(got).all() and np.mean(got != exact) > 0.01
  assert np.abs(got - exact).max() <= (T + 2) * BF16_HALF_ULP * 2 * np.abs(exact).max()


def test_tensor_parallel_train_steps_with_bf16_partial_sums_stay_close_to_one_device(mesh_train_losses):
  """Step 1 has the same parameters on both: its loss moves only by the bf16 roundings of the
  o and down outputs, relative 2^-8 per rounding at most (observed ~1e-4), while the exact mode
  agrees to ~1e-6 (the losses test below). The loss must move: the rounding is active."""
  ref, exact, rounded = (mesh_train_losses[m]["losses"] for m in ("1", "tensor=8:int32", "tensor=8"))
  assert rounded[0] != exact[0]
  np.testing.assert_allclose(rounded, ref, rtol=BF16_HALF_ULP)


def test_the_same_activation_codes_serve_the_forward_and_dw_when_the_weight_is_split(tp_runs):
  """bf16 activations hit exact ties (x = max/2 -> 63.5); the codes are defined with the f32
  reciprocal of the scale, so the program with a split weight rounds them as the replicated
  one does (with a division, XLA rewrote it differently per program: dW changed by one code)."""
  a = tp_runs["arrays"]
  np.testing.assert_array_equal(a["rtne_dw_split"], a["rtne_dw_replicated"])


@pytest.mark.slow  # its own 8-device worker (about 25 s); test_comm.py reads s8 gathers on a data x fsdp mesh
def test_fsdp_gathers_the_int8_weights_not_the_f32_master_weights(fsdp_train):
  """Under FSDP XLA quantizes the local weight shard first (the per-channel scale needs only a
  small max all-reduce) and all-gathers int8 codes: the block projections are gathered as s8;
  its losses and gradient norms are the one-device ones within float reordering (see the test below)."""
  run = fsdp_train["fsdp=8"]
  _assert_agrees_with_one_device(run, fsdp_train["1"], "fsdp=8")
  gathers = [c for c in run["collectives"] if c["kind"] == "all-gather"]
  s8 = [s for c in gathers if c["dtype"] == "s8" for s in c["shapes"]]
  assert len(s8) >= PROJECTIONS_PER_LAYER * LAYERS, s8
  block_shapes = {(64, 64), (64, 32), (64, 192), (192, 64)}  # q/o, k/v, gate/up, down of tiny
  assert not [s for c in gathers if c["dtype"] == "f32" for s in c["shapes"] if tuple(s) in block_shapes]


def test_mixed_meshes_shard_weights_over_fsdp_and_tensor(mesh_train_losses):
  run = mesh_train_losses["data=2,fsdp=2,tensor=2:int32"]
  assert run["devices"] == 8 and run["q_spec"] == "P(None, 'fsdp', 'tensor')"
  assert mesh_train_losses["1"]["devices"] == 1


# Mesh independence of training, read from the same runs (one 8-device worker for the whole module):
# the losses on every mesh and the global step of every projection in a sharded train step.


def test_train_losses_agree_across_meshes_within_float_reordering(mesh_train_losses):
  """Three `tiny` steps (s3r_ec) on 1 device and on 8 devices (1x8 fsdp x tensor, 2x2x2 data x
  fsdp x tensor; 8x1 in the FSDP test above, 4x2 and 2x4 in test_checkpoint_reshard.py).

  Not bitwise: the quantizers are (test_mesh_independence.py), but some float reductions span shards and XLA
  sums them in another order: the cross-entropy's log-sum-exp over the vocabulary (tensor
  sharded) and its token mean (batch sharded), the f32 partial sums of the bf16 logits and
  embedding gradients over batch shards, the global gradient norm. XLA:CPU also keeps bf16
  activations in f32 inside fusions (xla_allow_excess_precision, on by default), and a sharding
  constraint materializes them as bf16 where a one-device program fuses across it. Step 1 (same
  parameters) agrees to ~1e-6; an ulp in a bf16 gradient occasionally flips a stochastic
  rounding decision, so later steps drift further (observed < 4e-5; bound 3e-4).
  """
  ref = mesh_train_losses["1"]
  assert len(ref["losses"]) == 3 and all(np.isfinite(ref["losses"]))
  for mesh in ("tensor=8:int32", "data=2,fsdp=2,tensor=2:int32"):  # bf16 partial sums: test_tensor_parallel.py
    _assert_agrees_with_one_device(mesh_train_losses[mesh], ref, mesh)


def _assert_agrees_with_one_device(run: dict, ref: dict, mesh: str) -> None:
  """Losses and gradient norms of a sharded run against the one-device run (bounds: the test above)."""
  np.testing.assert_allclose(run["losses"][0], ref["losses"][0], rtol=1e-5, err_msg=mesh)
  np.testing.assert_allclose(run["losses"], ref["losses"], rtol=3e-4, err_msg=mesh)
  np.testing.assert_allclose(run["grad_norms"], ref["grad_norms"], rtol=3e-3, err_msg=mesh)


def _global_delta(x, w, g):
  """Δ = max|s_x G s_w| / 127 over the whole tensor, in numpy f32, in the backward's order of operations."""
  inv = np.float32(1 / 127)
  sx = np.abs(x).max(axis=-1) * inv
  sx = np.where(sx == 0, np.float32(1), sx)
  sw = np.abs(w).max(axis=0) * inv
  sw = np.where(sw == 0, np.float32(1), sw)
  return np.abs(sx[..., None] * g * sw).max() * inv


def test_a_sharded_train_step_quantizes_with_the_global_step(mesh_train_losses, tmp_path_factory):
  """In the first step of `tiny` on 2x2x2 (data x fsdp x tensor), every projection's Δ is
  bitwise the max over the whole gathered G' (not a per-shard max), as on one device. Across the
  two runs the upstream gradients G themselves differ by bf16 rounding (see the losses test), so
  Δ agrees only to a few bf16 ulps (observed < 1.5%)."""
  out = mesh_train_losses["_out"]
  deltas, local_differs = {}, 0
  for mesh in ("1", "data=2,fsdp=2,tensor=2:int32"):
    run, ops = mesh_train_losses[mesh], np.load(f"{out}/operands_{mesh}.npz")
    deltas[mesh] = np.asarray(run["deltas"], np.float32)
    assert len(deltas[mesh]) == 14 and np.all(deltas[mesh] > 0)
    for i, delta in enumerate(deltas[mesh]):
      x, w, g = ops[f"x_{i}"], ops[f"w_{i}"], ops[f"g_{i}"]
      assert delta == _global_delta(x, w, g), (mesh, i)
      # the 2x2x2 run holds 2 sequences per device: a per-shard max would often be smaller
      local_differs += any(_global_delta(x[r : r + 2], w, g[r : r + 2]) != delta for r in range(0, 8, 2))
  assert local_differs >= 14  # so the bitwise check above does tell a global from a local step
  np.testing.assert_allclose(deltas["data=2,fsdp=2,tensor=2:int32"], deltas["1"], rtol=0.03)
