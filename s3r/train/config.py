"""Configuration of one training run (what `s3r train` flags set).

Defaults that depend on the run are resolved when the config is built, so a saved config
holds concrete numbers: `vocab` and `seq` default to the preset's vocabulary and maximum
sequence length (`--preset tiny` trains the model the README describes), `warmup` to
min(30, steps // 10). Errors name the command-line flag (`--warmup`) and the field.
"""

from __future__ import annotations

import dataclasses
import math

from s3r.data.tokenizer import MIN_VOCAB_SIZE
from s3r.model import PRESETS, ModelConfig
from s3r.model import preset as model_preset
from s3r.model.config import TP_PARTIAL_SUMS
from s3r.quant import DEFAULT_RECIPE, RECIPES
from s3r.train.optimizer import OptimizerConfig


class ConfigError(ValueError):
  """A problem with what the user asked for (flags, mesh, run directory): reported in one line."""


# Fields that may differ between a run and its `--resume`: they do not change the numbers
# (the mesh changes only the order of some float reductions; see docs/scaling.md).
RESUMABLE_CHANGES = ("out", "resume", "eval_every", "eval_batches", "ckpt_every", "progress", "cache_dir", "mesh")
# Fields that may also change on `--resume` but change the numbers from then on: `steps` may grow (extending a
# run stretches the cosine schedule to the new total; see `TrainConfig.resume_mismatches`).
EXTENDABLE = ("steps",)
DEFAULT_WARMUP = 30  # warm-up steps of a long run; short runs warm up for a tenth of their steps
MAX_LR = 1.0  # larger peak learning rates are refused as typos (AdamW steps are ~lr per parameter)
MAX_SEQ = 1 << 20  # longer sequences are refused before anything is compiled


def flag(field: str) -> str:
  """The `s3r train` flag of a TrainConfig field, with the field: "--warmup (warmup)"."""
  return f"--{field.replace('_', '-')}"


def _error(field: str, requirement: str, value) -> ConfigError:
  return ConfigError(f"{flag(field)} must be {requirement}, got {value!r} (TrainConfig.{field})")


def default_warmup(steps: int) -> int:
  """The warm-up of a run of `steps` steps when none is given: min(30, steps // 10)."""
  return min(DEFAULT_WARMUP, steps // 10)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything a training run needs; saved in <out>/config.json and in every checkpoint."""

  out: str  # run directory: metrics.jsonl, loss.png, config.json, checkpoints/
  preset: str = "cpu-small"  # model preset (s3r.model.PRESETS)
  recipe: str = DEFAULT_RECIPE  # quantization recipe of the block projections (s3r.quant.RECIPES)
  steps: int = 300  # optimizer steps in the whole run
  lr: float = 2e-3  # peak learning rate, in (0, MAX_LR]
  warmup: int | None = None  # linear warm-up steps (None: default_warmup(steps))
  batch: int = 8  # sequences per step (global batch)
  seq: int | None = None  # tokens per sequence (None: the preset's max_seq_len)
  data: str | None = None  # corpus (None: enwiki under the data root, else the stdlib; see s3r.data.prepare)
  vocab: int | None = None  # tokenizer vocabulary size (None: the preset's vocab_size)
  max_train_docs: int | None = None  # keep only the first N training documents (quick runs)
  cache_dir: str = ".cache/s3r"  # tokenizer and token cache
  seed: int = 0  # seeds parameters, quantizer randomness and batch order
  eval_every: int = 100  # validation loss every N steps (and at the end)
  eval_batches: int = 16  # batches per validation set
  ckpt_every: int = 100  # checkpoint every N steps (and at the end)
  resume: bool = False  # continue from the latest checkpoint in `out`
  mesh: str | None = None  # device mesh, e.g. "data=2,fsdp=2,tensor=2" (None: one device)
  tp_partial_sums: str = "bf16"  # tensor-parallel partial sums: "bf16" per shard (the paper) or exact "int32"
  progress: bool = True  # show a tqdm progress bar

  def __post_init__(self):
    for field, allowed in (("preset", PRESETS), ("recipe", RECIPES), ("tp_partial_sums", TP_PARTIAL_SUMS)):
      if getattr(self, field) not in allowed:
        raise _error(field, f"one of {', '.join(allowed)}", getattr(self, field))
    base = PRESETS[self.preset]
    for field, default in (("vocab", base.vocab_size), ("seq", base.max_seq_len)):
      if getattr(self, field) is None:
        object.__setattr__(self, field, default)
    for field in ("steps", "batch", "seq", "vocab", "eval_every", "eval_batches", "ckpt_every", "seed"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < (0 if field == "seed" else 1):
        raise _error(field, "an integer >= " + ("0" if field == "seed" else "1"), value)
    if self.warmup is None:
      object.__setattr__(self, "warmup", default_warmup(self.steps))
    if not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
      raise _error("warmup", f"an integer in [0, --steps={self.steps}]", self.warmup)
    if self.vocab_size < MIN_VOCAB_SIZE:
      raise _error("vocab", f">= {MIN_VOCAB_SIZE} (256 bytes + end-of-text)", self.vocab)
    if self.seq_len > MAX_SEQ:
      raise _error("seq", f"<= {MAX_SEQ:,}", self.seq)
    if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
      raise _error("lr", f"a finite number in (0, {MAX_LR:g}]", self.lr)
    if self.max_train_docs is not None and (not isinstance(self.max_train_docs, int) or self.max_train_docs < 1):
      raise _error("max_train_docs", "an integer >= 1 (or unset)", self.max_train_docs)
    if not self.out:
      raise _error("out", "a non-empty path", self.out)

  # The fields that __post_init__ resolves, as the ints they then are.

  @property
  def vocab_size(self) -> int:
    """The tokenizer vocabulary size asked for: `vocab`, or the preset's when unset."""
    assert self.vocab is not None  # resolved by __post_init__
    return self.vocab

  @property
  def seq_len(self) -> int:
    """Tokens per sequence: `seq`, or the preset's max_seq_len when unset."""
    assert self.seq is not None  # resolved by __post_init__
    return self.seq

  @property
  def warmup_steps(self) -> int:
    """Linear warm-up steps: `warmup`, or default_warmup(steps) when unset."""
    assert self.warmup is not None  # resolved by __post_init__
    return self.warmup

  @property
  def batch_shape(self) -> tuple[int, int]:
    """[batch, seq + 1]: the token windows of one step (inputs, and targets shifted by one)."""
    return self.batch, self.seq_len + 1

  def model_config(self, vocab_size: int, **overrides) -> ModelConfig:
    """The preset with the tokenizer's vocabulary, this run's recipe and room for `seq` tokens;
    `overrides` replace further fields as in `s3r.model.preset` (e.g. n_layers=2, remat=True)."""
    base = PRESETS[self.preset]
    fields = {
      "vocab_size": vocab_size,
      "recipe": self.recipe,
      "max_seq_len": max(base.max_seq_len, self.seq_len),
      "tp_partial_sums": self.tp_partial_sums,
    }
    return model_preset(self.preset, **{**fields, **overrides})

  def optimizer_config(self) -> OptimizerConfig:
    return OptimizerConfig(lr=self.lr, total_steps=self.steps, warmup_steps=self.warmup_steps)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})

  def resume_mismatches(self, saved: TrainConfig, *, at_step: int = 0) -> list[str]:
    """What in this config may not differ from `saved` when resuming at `at_step`: every field but
    RESUMABLE_CHANGES, and `steps` only when it is lower than `at_step` (a larger `steps` extends the run:
    the cosine decay is stretched to the new total from `at_step` on)."""
    mine, theirs = self.to_dict(), saved.to_dict()
    out = [
      f"{flag(k)}: {theirs[k]!r} -> {mine[k]!r}"
      for k in mine
      if k not in RESUMABLE_CHANGES + EXTENDABLE and mine[k] != theirs[k]
    ]
    if self.steps < at_step:
      out.append(f"--steps: {self.steps} is below the checkpoint's step {at_step}")
    return out
