"""The FP8 gradient recipes, and the all-FP8 one (E4M3 forward), train end to end through `s3r train` (on `tiny`,
a few steps; the all-FP8 one on `moe-tiny` too, slow)."""

import json
import math

import pytest

from s3r import cli

RECIPES = [
  ("tiny", "s3r_ec_dx@e5m2"),
  ("tiny", "s3r_ec_dx@e5m2+fwd_e4m3"),
  pytest.param("tiny", "s3r@e4m3", marks=pytest.mark.slow),
  pytest.param("moe-tiny", "s3r_ec_dx@e5m2+fwd_e4m3", marks=pytest.mark.slow),  # all-FP8 expert GEMMs too
]


@pytest.mark.parametrize("preset, recipe", RECIPES)
def test_an_fp8_gradient_recipe_trains_through_s3r_train(preset, recipe, tmp_path, corpus_dir, cache_dir):
  argv = ["train", "--preset", preset, "--recipe", recipe, "--steps", "8", "--warmup", "2", "--lr", "3e-3"]
  argv += ["--batch", "4", "--seq", "32", "--vocab", "300", "--data", str(corpus_dir), "--cache-dir", str(cache_dir)]
  argv += ["--out", str(tmp_path / "run"), "--eval-every", "8", "--eval-batches", "2", "--ckpt-every", "8"]
  assert cli.main(argv + ["--no-progress"]) == 0
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in records if "loss" in r]
  assert len(losses) == 9 and all(math.isfinite(loss) for loss in losses)  # steps 0 to 8
  assert losses[-1] < losses[0] - 0.1  # it learns
  assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["recipe"] == recipe
