"""`python -m benchmarks comm` end to end, and what S3R-EC's dW correction moves under data/FSDP sharding.

The two-way correction subtracts a rank-(B+1) update built from per-example factors
(x̄_b [K], c_b [N], p_b [K], m_b); under data parallelism it must gather those small factors,
never reduce a weight-sized f32 partial (docs/algorithm.md §1). Measured on the compiled train step
of `tiny` at a global batch of 128 (the einsum form of the update, B > 64).
"""

import json

import pytest

from tests.distributed.conftest import run_worker

TINY_PROJECTION_SHAPES = [
  (64, 64),
  (64, 32),
  (64, 32),
  (64, 64),
  (64, 192),
  (64, 192),
  (192, 64),
]  # q k v o gate up down
BATCH = 128


@pytest.fixture(scope="module")
def comm_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("comm")
  run_worker("comm", out)
  return json.loads((out / "comm.json").read_text()), (out / "comm.md").read_text()


@pytest.mark.slow
def test_comm_writes_metadata_and_a_table_per_mesh(comm_run):
  doc, md = comm_run
  assert doc["meta"]["command"].startswith("python -m benchmarks comm")
  assert doc["meta"]["jax_version"] and doc["meta"]["git"]["revision"] and doc["meta"]["date_utc"]
  assert [(r["mesh_spec"], r["recipe"]) for r in doc["results"]] == [
    ("data=2,fsdp=4", "s3r"),
    ("data=2,fsdp=4", "s3r_ec"),
  ]
  assert "### mesh data=2,fsdp=4" in md and "| `s3r_ec` |" in md
  for r in doc["results"]:
    assert r["bytes"]["all-reduce"]["f32"] > 0 and r["bytes"]["all-gather"]["s8"] > 0  # grads; int8 weights


def _f32_reductions(result):
  return sorted(
    tuple(s)
    for c in result["collectives"]
    if c["dtype"] == "f32" and c["kind"] in ("all-reduce", "reduce-scatter")
    for s in c["shapes"]
  )


def test_ec_gathers_small_factors_instead_of_reducing_weight_sized_f32_partials(comm_run):
  doc, _ = comm_run
  s3r, ec = (next(r for r in doc["results"] if r["recipe"] == name) for name in ("s3r", "s3r_ec"))
  smallest_weight = min(k * n for k, n in TINY_PROJECTION_SHAPES)
  added = list(_f32_reductions(ec))
  for shape in _f32_reductions(s3r):
    added.remove(shape)
  for shape in added:  # the per-example column terms: [K] vectors, never [K, N]
    n = 1
    for d in shape:
      n *= d
    assert n < smallest_weight, f"s3r_ec reduces an f32 buffer of shape {shape}"
  extra_reduced = ec["bytes"]["all-reduce"]["f32"] - s3r["bytes"]["all-reduce"]["f32"]
  weights = 4 * sum(k * n for k, n in TINY_PROJECTION_SHAPES) * 2  # f32 bytes of both layers' projections
  assert extra_reduced < weights / 10
  # What it gathers instead: per-example factors x̄ [K, B] and c [B, N], small next to the weights.
  factors = 4 * BATCH * sum(k + n for k, n in TINY_PROJECTION_SHAPES) * 2
  extra_gathered = ec["bytes"]["all-gather"]["f32"] - s3r["bytes"]["all-gather"]["f32"]
  assert 0 < extra_gathered <= 2 * factors
