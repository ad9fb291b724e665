"""Every family's tiny sibling trains from the command line (`s3r train --preset SIBLING --recipe R`) with every
recipe of `s3r recipes`, and its loss falls.

Each case runs the real CLI entry in-process (`s3r.cli.main`) on the conftest corpus (tokenizer vocabulary V = 300,
batch 4 x seq 32, 24 steps at lr 1e-2) with an empty data root (no c4 validation set to encode) and reads the run's
metrics.jsonl. Each family has its own recipe (DEFAULT: `CLI_RECIPE` of its facts in tests/model/families/<name>.py,
all different); the default suite trains those whose facts say `CLI_IN_DEFAULT_SUITE` (the dense Llama block, and
the routed MoE block with its logged metrics); the others and the whole family x recipe grid are marked slow:
`pytest -m slow tests/train/test_families_cli.py`. (Every family's forward is compared with its reference
implementation in the default suite by tests/model; compiling one family's train step here costs 15-55 s.)

Why the loss criterion cannot pass by chance: at initialization the logits are nearly uniform, so every token costs
about ln V whichever token it is, and batch sampling cannot move the step-0 loss (it sits within a few hundredths of a
nat of ln V = 5.70). A run that learns nothing keeps every later batch at that cost up to the same few hundredths. The
test asks the mean of the last LAST logged training losses to lie FALL_NATS = 1 nat below the step-0 loss and, in
addition, Z = 6 standard errors of those last losses (their batch-to-batch and rounding noise measured in the run
itself) below it; the held-out validation loss, computed on the same batches at step 0 and at the end, must fall by
FALL_NATS as well. `test_the_fall_criterion_rejects_a_run_that_does_not_learn` shows that a run at a negligible
learning rate fails it.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from s3r import cli
from s3r import model as M
from s3r.model.config import MoeFields
from s3r.quant import RECIPES
from tests.model import family_facts

SIBLINGS = family_facts.SIBLINGS  # one per registered family
DEFAULT = {p: family_facts.of_sibling(p).CLI_RECIPE for p in SIBLINGS}  # each family's own recipe
IN_DEFAULT_SUITE = tuple(p for p in SIBLINGS if family_facts.of_sibling(p).CLI_IN_DEFAULT_SUITE)
STEPS, LR, VOCAB = 24, 1e-2, 300
LAST = 6  # logged training losses averaged at the end of a run
FALL_NATS = (
  1.0  # required fall of the loss from step 0 (far above the few-hundredths noise of a run that does not learn)
)
Z = 6.0  # required fall in standard errors of the last LAST losses
MOE_METRICS = ("load_balance_loss", "dropped_fraction")


def _train(out: pathlib.Path, preset: str, recipe: str, corpus: pathlib.Path, cache: pathlib.Path, lr: float = LR):
  """Runs `s3r train` in-process; returns its exit code and the records of metrics.jsonl."""
  argv = ["train", "--preset", preset, "--recipe", recipe, "--steps", STEPS, "--lr", lr, "--batch", 4, "--seq", 32]
  argv += ["--vocab", VOCAB, "--data", corpus, "--cache-dir", cache, "--out", out, "--eval-every", STEPS]
  argv += ["--eval-batches", 1, "--ckpt-every", STEPS, "--no-progress"]
  code = cli.main([str(a) for a in argv])
  lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
  return code, [json.loads(line) for line in lines]


def loss_fall(records: list[dict]) -> tuple[float, float, float]:
  """(training-loss fall from step 0 to the mean of the last LAST steps, its standard error, validation-loss fall)."""
  last = np.array([r["loss"] for r in records[-LAST:]])
  return (
    records[0]["loss"] - last.mean(),
    last.std(ddof=1) / math.sqrt(LAST),
    records[0]["val_loss"] - records[-1]["val_loss"],
  )


def learned(records: list[dict]) -> bool:
  fall, stderr, val_fall = loss_fall(records)
  return fall > max(FALL_NATS, Z * stderr) and val_fall > FALL_NATS


def _check_run(code: int, records: list[dict], preset: str, recipe: str) -> None:
  name = f"{preset} / {recipe}"
  assert code == 0, f"{name}: exit code {code}"
  assert [r["step"] for r in records] == list(range(STEPS + 1)), name
  values = [r[k] for r in records for k in ("loss", "grad_norm", "val_loss") if k in r]
  assert all(math.isfinite(v) for v in values), f"{name}: non-finite metrics"
  assert abs(records[0]["loss"] - math.log(VOCAB)) < 0.3, f"{name}: step-0 loss {records[0]['loss']:.3f} is not ~ln V"
  fall, stderr, val_fall = loss_fall(records)
  assert learned(records), f"{name}: loss fell {fall:.3f} +- {stderr:.3f} nats, validation {val_fall:.3f}"
  if isinstance(M.PRESETS[preset], MoeFields):
    for r in records[1:]:
      assert set(MOE_METRICS) <= set(r), f"{name}: step {r['step']} lacks {MOE_METRICS}"
      assert r["load_balance_loss"] > 0 and math.isfinite(r["load_balance_loss"]), (name, r)
      assert 0 <= r["dropped_fraction"] <= 1, (name, r)


@pytest.fixture
def empty_data_root(tmp_path, monkeypatch):
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))
  (tmp_path / "empty-root").mkdir()


def test_the_families_default_runs_rotate_the_recipes():
  assert len(set(DEFAULT.values())) == len(SIBLINGS)
  assert set(DEFAULT.values()) <= set(RECIPES)


GRID = [
  pytest.param(p, r, id=f"{p}-{r}", marks=() if DEFAULT[p] == r and p in IN_DEFAULT_SUITE else pytest.mark.slow)
  for r in RECIPES  # recipe-major: a partial run of the grid covers every family
  for p in SIBLINGS
]


@pytest.mark.parametrize("preset, recipe", GRID)
def test_sibling_trains_from_the_cli_and_its_loss_falls(
  preset, recipe, tmp_path, corpus_dir, cache_dir, empty_data_root
):
  code, records = _train(tmp_path / "run", preset, recipe, corpus_dir, cache_dir)
  _check_run(code, records, preset, recipe)


def test_the_fall_criterion_rejects_a_run_that_does_not_learn():
  rng = np.random.default_rng(0)
  flat = [{"loss": math.log(VOCAB) + 0.02 * rng.standard_normal(), "val_loss": math.log(VOCAB)} for _ in range(25)]
  assert not learned(flat)
  falling = [
    {**r, "loss": r["loss"] - 3.0 * i / 24, "val_loss": r["val_loss"] - 3.0 * i / 24} for i, r in enumerate(flat)
  ]
  assert learned(falling)


@pytest.mark.slow
def test_a_sibling_at_a_negligible_learning_rate_fails_the_fall_criterion(
  tmp_path, corpus_dir, cache_dir, empty_data_root
):
  code, records = _train(tmp_path / "run", "llama-tiny", "s3r_ec_dx", corpus_dir, cache_dir, lr=1e-7)
  assert code == 0 and len(records) == STEPS + 1
  assert not learned(records), loss_fall(records)
