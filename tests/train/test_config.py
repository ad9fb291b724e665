"""TrainConfig: preset defaults, warm-up scaling, refusal of absurd values with the flag named."""

import dataclasses
import math
from typing import Any

import pytest

from s3r.model import PRESETS, param_count
from s3r.quant.formats import FORMATS
from s3r.train.config import ConfigError, TrainConfig, default_warmup


@pytest.mark.parametrize("name", list(PRESETS))
def test_vocab_and_seq_default_to_the_presets_own(name):
  cfg = TrainConfig(out="run", preset=name)
  assert cfg.vocab is not None and (cfg.vocab, cfg.seq) == (PRESETS[name].vocab_size, PRESETS[name].max_seq_len)
  assert param_count(cfg.model_config(cfg.vocab)) == param_count(PRESETS[name])


def test_tiny_preset_trains_the_documented_164160_parameter_model():
  cfg = TrainConfig(out="run", preset="tiny")
  assert cfg.vocab == 512 and param_count(cfg.model_config(cfg.vocab)) == 164_160 and cfg.seq == 128


def test_flags_override_the_preset_defaults():
  cfg = TrainConfig(out="run", preset="tiny", vocab=300, seq=32)
  assert (cfg.vocab, cfg.seq) == (300, 32)


@pytest.mark.parametrize("steps, warmup", [(20, 2), (5, 0), (300, 30), (10_000, 30)])
def test_default_warmup_scales_with_short_runs(steps, warmup):
  assert default_warmup(steps) == warmup == TrainConfig(out="run", steps=steps).warmup


@pytest.mark.parametrize(
  "field, value, flag",
  [
    ("lr", 1e300, "--lr"),
    ("lr", math.nan, "--lr"),
    ("lr", math.inf, "--lr"),
    ("lr", 0.0, "--lr"),
    ("lr", -1e-3, "--lr"),
    ("steps", 0, "--steps"),
    ("steps", -3, "--steps"),
    ("batch", 0, "--batch"),
    ("seq", 0, "--seq"),
    ("seq", 1 << 30, "--seq"),
    ("warmup", 50, "--warmup"),
    ("vocab", 10, "--vocab"),
    ("max_train_docs", 0, "--max-train-docs"),
    ("eval_every", -1, "--eval-every"),
    ("seed", -1, "--seed"),
    ("keep_every", 0, "--keep-every"),
    ("keep_every", 150, "--keep-every"),  # not a multiple of --ckpt-every (100)
    ("preset", "huge", "--preset"),
    ("recipe", "fp4", "--recipe"),
    ("recipe", "bf16@int4", "--recipe"),
    ("recipe", "s3r@int3", "--recipe"),
  ],
)
def test_absurd_values_are_refused_naming_the_flag(field, value, flag):
  with pytest.raises(ConfigError) as e:
    fields: dict[str, Any] = {"out": "run", "steps": 20, field: value}
    TrainConfig(**fields)
  assert str(e.value).startswith(flag + " ") and f"TrainConfig.{field}" in str(e.value)


def test_a_recipe_at_a_gradient_format_is_accepted_and_reaches_the_model():
  cfg = TrainConfig(out="run", steps=20, recipe="s3r_ec_dx@nvfp4")
  assert cfg.model_config(cfg.vocab_size).recipe.name == "s3r_ec_dx@nvfp4"


@pytest.mark.parametrize("fmt", [n for n, f in FORMATS.items() if not f.capabilities.grouped])
def test_a_gradient_format_without_grouped_gemms_is_refused_up_front_for_a_model_with_experts(fmt):
  """The grouped (expert) GEMMs refuse the block-scaled FP4 codes: refused at the flag, before any tracing."""
  with pytest.raises(ConfigError) as e:
    TrainConfig(out="run", steps=20, preset="moe-tiny", recipe=f"s3r@{fmt}")
  assert str(e.value).startswith("--recipe ") and fmt in str(e.value) and "dense models" in str(e.value)
  assert TrainConfig(out="run", steps=20, preset="moe-tiny", recipe="s3r@int4").recipe.name == "s3r@int4"


def test_the_e4m3_forward_is_taken_for_a_model_with_experts_but_not_with_fp4_gradients():
  cfg = TrainConfig(out="run", steps=20, preset="moe-tiny", recipe="s3r_ec_dx@e5m2+fwd_e4m3")
  assert cfg.model_config(cfg.vocab_size).recipe.name == "s3r_ec_dx@e5m2+fwd_e4m3"
  with pytest.raises(ConfigError) as e:
    TrainConfig(out="run", steps=20, preset="moe-tiny", recipe="s3r_ec_dx@nvfp4+fwd_e4m3")
  assert str(e.value).startswith("--recipe ") and "nvfp4" in str(e.value) and "dense models" in str(e.value)


def test_resume_may_extend_steps_but_not_shorten_below_the_checkpoint_or_change_the_numbers():
  saved = TrainConfig(out="run", preset="tiny", steps=60)
  assert saved.resume_mismatches(saved, at_step=60) == []
  longer = dataclasses.replace(saved, steps=80, eval_every=7, cache_dir="elsewhere")
  assert longer.resume_mismatches(saved, at_step=60) == []
  shorter = dataclasses.replace(saved, steps=40)
  assert any("--steps" in m for m in shorter.resume_mismatches(saved, at_step=60))
  other = dataclasses.replace(saved, recipe="int8_sr", lr=4e-3)  # a higher peak (a lower one is allowed)
  assert [m.split(":")[0] for m in other.resume_mismatches(saved, at_step=60)] == ["--recipe", "--lr"]
