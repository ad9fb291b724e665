"""Peers bench: without aqtp/qwix it says so and skips their rows; our rows still run."""

from __future__ import annotations

import json
import sys

import jax

from benchmarks import cli, peers


def test_peers_missing_are_skipped(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "aqt", None)  # `import aqt...` now raises ImportError
  monkeypatch.setitem(sys.modules, "aqt.jax", None)
  monkeypatch.setitem(sys.modules, "aqt.jax.v2", None)
  monkeypatch.setitem(sys.modules, "qwix", None)
  status = peers.available()
  assert all((why := status[p]) is not None and "pip install" in why for p in peers.PEERS)
  args = cli.build_parser().parse_args(
    [
      "peers",
      "--shapes",
      "64x128",
      "--tokens",
      "32",
      "--ours",
      "s3r_ec_dx",
      "--timed-ours",
      "s3r_ec_dx",
      "--repeats",
      "1",
      "--warmup",
      "0",
      "--keys",
      "1",
      "--out-dir",
      str(tmp_path),
    ]
  )
  assert args.func(args) == 0
  stem = tmp_path / f"bench_peers_{jax.default_backend()}"
  doc = json.loads(stem.with_suffix(".json").read_text())["results"]
  assert set(doc["skipped"]) == set(peers.PEERS)
  (shape,) = doc["shapes"]
  assert list(shape["configs"]) == ["s3r_ec_dx"]
  assert shape["configs"]["s3r_ec_dx"]["errors"]["dx_rel_err"] > 0
  assert "Skipped (not installed)" in stem.with_suffix(".md").read_text()


def test_gradient_error_is_zero_for_the_exact_gradient():
  from benchmarks import ffn

  inputs = ffn.make_inputs(8, 16, 32)
  exact = peers.exact_grads(*inputs[:5])
  err = peers.gradient_errors(lambda *a: exact, inputs, exact, keys=2)
  assert err["dx_rel_err"] == 0 and err["dw_rel_err"] == 0 and err["keys"] == 2
