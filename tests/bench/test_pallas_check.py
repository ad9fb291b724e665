"""benchmarks/pallas_check.py: every check carries its family, and a failure names the failing
families and checks; a failure of the paths the default takes is exit status 1, one of the
diagnostic families alone is 3 (device scripts keep the Pallas path then)."""

import json
import pathlib

from benchmarks import pallas_check


def test_a_difference_is_reported_by_family_and_name():
  same = pallas_check._compare("xla dot", "int8 dot [K, 8] x [8, N] vs numpy", [1, 2], [1, 2])
  differs = pallas_check._compare("tiled dW", "int32 dW tiled vs ragged, tile 8", [1, 5, 3], [1, 2, 4])
  assert same["family"] == "xla dot" and same["bit_exact"]
  assert differs["family"] == "tiled dW" and not differs["bit_exact"]
  assert differs["mismatches"] == 2 and differs["max_abs_diff"] == 3.0
  report = {"checks": [same, differs], "errors": [{"part": "s3r", "error": "RuntimeError: x"}]}
  assert pallas_check._failed_families(report) == {
    "tiled dW": ["int32 dW tiled vs ragged, tile 8"],
    "errors": ["s3r"],
  }
  assert pallas_check._compare("pallas", "shape", [1, 2], [1, 2, 3])["bit_exact"] is False


def test_a_float_check_passes_within_its_bound_and_fails_beyond_it():
  within = pallas_check._compare_within("bf16", "bf16 dW pallas vs ragged", [1.0, 2.0], [1.0, 2.5], [0.0, 0.5])
  beyond = pallas_check._compare_within("bf16", "bf16 dX pallas vs ragged", [1.0, 2.0], [1.0, 2.5], [0.0, 0.4])
  assert not within["bit_exact"] and pallas_check.passes(within) and not pallas_check.passes(beyond)
  report = {"checks": [within, beyond], "errors": []}
  assert pallas_check._failed_families(report) == {"bf16": ["bf16 dX pallas vs ragged"]}


def test_the_cpu_run_passes_with_every_family_and_tile(tmp_path, capsys):
  """The smoke stage's call (interpret mode on the CPU), one recipe."""
  argv = ["--shape", "64x8x2x48", "--tokens", "24", "--recipes", "s3r", "--out-dir", str(tmp_path)]
  assert pallas_check.main(argv) == 0
  report = json.loads((tmp_path / "pallas_check.json").read_text())
  assert report["passed"] and report["failed_families"] == {}
  assert {c["family"] for c in report["checks"]} == set(pallas_check.FAMILIES)
  assert report["tiled_dw_tiles"] == [8, 32, 128]
  names = {c["name"] for c in report["checks"]}
  assert {f"{t} dW tiled vs ragged, tile {n}" for t in ("int32", "f32") for n in (8, 32, 128)} <= names
  assert "PALLAS CHECK PASSED" in capsys.readouterr().out


def test_only_diagnostic_failures_are_told_apart_from_failures_of_the_default_paths():
  assert pallas_check.diagnostic_only({"tiled dW": ["a"], "xla dot": ["b"]})
  assert pallas_check.diagnostic_only({"errors": ["tiled dW"]})
  assert not pallas_check.diagnostic_only({})
  assert not pallas_check.diagnostic_only({"tiled dW": ["a"], "pallas": ["b"]})
  assert not pallas_check.diagnostic_only({"tiled dW": ["a"], "errors": ["s3r"]})


def test_the_smoke_stage_passes_on_diagnostic_failures_and_stops_on_a_pallas_failure(tmp_path, monkeypatch):
  import importlib.util

  import pytest

  root = pathlib.Path(__file__).resolve().parents[2]
  spec = importlib.util.spec_from_file_location("device_smoke", root / "scripts" / "device_smoke.py")
  assert spec is not None and spec.loader is not None
  smoke = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(smoke)

  def fake_check(failed):
    def main(argv):
      out = pathlib.Path(argv[argv.index("--out-dir") + 1])
      out.mkdir(parents=True, exist_ok=True)
      (out / "pallas_check.json").write_text(json.dumps({"backend": "gpu", "failed_families": failed}))
      return 0 if not failed else pallas_check.DIAGNOSTIC_EXIT if pallas_check.diagnostic_only(failed) else 1

    return main

  monkeypatch.setattr(pallas_check, "main", fake_check({"tiled dW": ["int32 dW tiled vs ragged, tile 8"]}))
  assert smoke._pallas(tmp_path)["diagnostic_failures"] == {"tiled dW": ["int32 dW tiled vs ragged, tile 8"]}
  monkeypatch.setattr(pallas_check, "main", fake_check({"pallas": ["int32 dW pallas vs ragged"]}))
  with pytest.raises(RuntimeError, match="failed in pallas"):
    smoke._pallas(tmp_path)
