"""Sharded checkpoints restored onto other meshes, and `s3r train --mesh` end to end.

`s3r train` runs 4 `tiny` steps on 8 simulated devices as a 4x2 (fsdp x tensor) mesh and
checkpoints at steps 2 and 4 (Orbax writes each array shard by shard). Its step-2 checkpoint
is resumed with `--resume --mesh fsdp=2,tensor=4` and with one device, and restored onto all
three meshes directly. The same 4x2 run's builder also imports the Llama Hugging Face fixture
(`--init-from`) onto its mesh.
"""

import jax
import numpy as np


def test_cli_trains_on_a_4x2_mesh_and_checkpoints(sharded_cli_run):
  result, out = sharded_cli_run["result"], sharded_cli_run["out"]
  records = result["4x2"]
  assert [r["step"] for r in records] == [0, 1, 2, 3, 4] and "val_loss" in records[-1]
  assert all(np.isfinite(r["loss"]) for r in records)
  assert sorted(p.name for p in (out / "run_4x2" / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]


def test_a_checkpoint_restores_bitwise_onto_other_meshes(sharded_cli_run):
  result, out = sharded_cli_run["result"], sharded_cli_run["out"]
  restored = result["restored"]
  assert restored["4x2"]["devices"] == restored["2x4"]["devices"] == 8 and restored["1"]["devices"] == 1
  assert restored["2x4"]["q_spec"] == "P(None, 'fsdp', 'tensor')" and restored["1"]["q_spec"] == "P(None, None, None)"
  ref = np.load(out / "restored_4x2.npz")
  assert len(ref.files) == restored["4x2"]["leaves"] > 3  # step, parameters, optimizer moments
  for mesh in ("2x4", "1"):
    other = np.load(out / f"restored_{mesh}.npz")
    for name in ref.files:
      np.testing.assert_array_equal(other[name], ref[name], err_msg=f"{name} on {mesh}")


def test_resuming_on_another_mesh_continues_to_the_same_losses(sharded_cli_run):
  """Steps 0-2 are copied from the 4x2 run; steps 3-4 run on 2x4 or one device from the
  bitwise-identical restored state and the same batches (the loader position is in the
  checkpoint). The quantizers draw the same thresholds, but float reductions that span shards
  (loss mean, log-sum-exp over the tensor-sharded vocabulary, f32 partial sums of the bf16
  logits/embedding gradients) run in another order, so the losses agree to float precision,
  not bitwise (observed rel. difference < 2e-5; bound 3e-4). Resuming on the same mesh is
  bitwise (tests/train/test_loop.py)."""
  result = sharded_cli_run["result"]
  ref = result["4x2"]
  for mesh in ("2x4", "1"):
    resumed = result[f"resumed_{mesh}"]
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]  # step 0: the initial loss
    assert [r["loss"] for r in resumed[:3]] == [r["loss"] for r in ref[:3]]  # kept from the original run
    np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in ref], rtol=3e-4, err_msg=mesh)
    np.testing.assert_allclose(resumed[-1]["val_loss"], ref[-1]["val_loss"], rtol=3e-4, err_msg=mesh)


def test_an_imported_hugging_face_checkpoint_lands_on_the_runs_mesh_with_its_values(sharded_cli_run):
  """`s3r train --init-from` places each parameter of the Llama fixture straight onto its sharding of the
  4x2 mesh as it is read; the sharded values are those of a one-device import."""
  from s3r import model as M
  from tests.model.test_hf_import import FIXTURES

  imported = sharded_cli_run["result"]["imported"]
  assert (imported["q_spec"], imported["q_devices"], imported["q_shard"]) == ("P(None, 'fsdp', 'tensor')", 8, [16, 32])
  _, want = M.load_hf(FIXTURES / "llama")
  got = np.load(sharded_cli_run["out"] / "imported.npz")
  flat = jax.tree_util.tree_flatten_with_path(want)[0]
  assert sorted(got.files) == sorted(jax.tree_util.keystr(k) for k, _ in flat)
  for k, x in flat:
    np.testing.assert_array_equal(got[jax.tree_util.keystr(k)], np.asarray(x), err_msg=jax.tree_util.keystr(k))
