"""What XLA reduces across tensor-parallel shards in a compiled `tiny` train step.

Row-parallel projections (o, down) contract the sharded heads / MLP dim in the forward
pass, and column-parallel ones (q, k, v, gate, up) contract it in the dX product of the
backward pass. Their int8 GEMMs produce int32 partial sums on each shard, and XLA all-reduces
those int32 accumulators (exact: integer addition is associative) before the f32 rescale and
the cast to bf16. Nothing is reduced in bf16: unlike the paper's TPU runs, which round each
shard's GEMM output to bf16 and reduce bf16 partial sums, these partial sums cost 4 bytes per
element and are bitwise independent of the tensor-parallel degree (docs/scaling.md).
"""

PROJECTIONS_PER_LAYER = 7  # q, k, v, o, gate, up, down
ROW_PARALLEL_PER_LAYER = 2  # o, down
LAYERS, D = 2, 64  # tiny


def _activation_all_reduces(run, dtype):
  """(op_name, shape) of the all-reduced buffers of one [tokens, D] activation over all 8 devices."""
  return [(c["op_name"], s) for c in run["collectives"] if c["kind"] == "all-reduce" and c["dtype"] == dtype
          and c["group_size"] == 8 for s in c["shapes"] if s[0] * (s[1] if len(s) == 2 else s[1] * s[2]) ==
          run["tokens"] * D and s[-1] == D]


def test_tensor_parallel_partial_sums_are_int32_accumulators(mesh_train_losses):
  run = mesh_train_losses["tensor=8"]  # pure TP: every weight split over 8 devices, tokens replicated
  s32 = _activation_all_reduces(run, "s32")
  assert len(s32) == PROJECTIONS_PER_LAYER * LAYERS, s32
  forward = [op for op, _ in s32 if "transpose" not in op]
  assert len(forward) == ROW_PARALLEL_PER_LAYER * LAYERS, s32  # o and down in the forward pass
  assert not [c for c in run["collectives"] if c["dtype"] == "bf16"], "no collective runs in bf16"


def test_fsdp_gathers_the_int8_weights_not_the_f32_master_weights(mesh_train_losses):
  """Under FSDP XLA quantizes the local weight shard first (the per-channel scale needs only a
  small max all-reduce) and all-gathers int8 codes: the block projections are gathered as s8."""
  run = mesh_train_losses["fsdp=8"]
  gathers = [c for c in run["collectives"] if c["kind"] == "all-gather"]
  s8 = [s for c in gathers if c["dtype"] == "s8" for s in c["shapes"]]
  assert len(s8) >= PROJECTIONS_PER_LAYER * LAYERS, s8
  block_shapes = {(64, 64), (64, 32), (64, 192), (192, 64)}  # q/o, k/v, gate/up, down of tiny
  assert not [s for c in gathers if c["dtype"] == "f32" for s in c["shapes"] if tuple(s) in block_shapes]


def test_mixed_meshes_shard_weights_over_fsdp_and_tensor(mesh_train_losses):
  run = mesh_train_losses["data=2,fsdp=2,tensor=2"]
  assert run["devices"] == 8 and run["q_spec"] == "P('fsdp', 'tensor')"
  assert mesh_train_losses["1"]["devices"] == 1
