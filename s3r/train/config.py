"""Configuration of one training run (what `s3r train` flags set)."""

from __future__ import annotations

import dataclasses

from s3r.data.tokenizer import MIN_VOCAB_SIZE
from s3r.model import PRESETS, ModelConfig, preset as model_preset
from s3r.model.config import TP_PARTIAL_SUMS
from s3r.quant import RECIPES
from s3r.train.optimizer import OptimizerConfig

class ConfigError(ValueError):
  """A problem with what the user asked for (flags, mesh, run directory): reported in one line."""


# Fields that may differ between a run and its `--resume`: they do not change the numbers
# (the mesh changes only the order of some float reductions; see docs/scaling.md).
RESUMABLE_CHANGES = ("out", "resume", "eval_every", "eval_batches", "ckpt_every", "progress", "cache_dir", "mesh")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything a training run needs; saved in <out>/config.json and in every checkpoint."""

  out: str  # run directory: metrics.jsonl, loss.png, config.json, checkpoints/
  preset: str = "cpu-small"  # model preset (s3r.model.PRESETS)
  recipe: str = "s3r_ec_dx"  # quantization recipe of the block projections (s3r.quant.RECIPES)
  steps: int = 300  # optimizer steps in the whole run
  lr: float = 2e-3  # peak learning rate
  warmup: int = 30  # linear warm-up steps
  batch: int = 8  # sequences per step (global batch)
  seq: int = 256  # tokens per sequence
  data: str | None = None  # corpus (None: enwiki under the shared data root, see s3r.data.prepare)
  vocab: int = 8192  # tokenizer vocabulary size requested from s3r.data.prepare
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
    if self.preset not in PRESETS:
      raise ConfigError(f"TrainConfig.preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
    if self.recipe not in RECIPES:
      raise ConfigError(f"TrainConfig.recipe must be one of {', '.join(RECIPES)}; got {self.recipe!r}")
    if self.tp_partial_sums not in TP_PARTIAL_SUMS:
      raise ConfigError(f"TrainConfig.tp_partial_sums must be one of {', '.join(TP_PARTIAL_SUMS)}; "
                        f"got {self.tp_partial_sums!r}")
    for field in ("steps", "batch", "seq", "vocab", "eval_every", "eval_batches", "ckpt_every"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"TrainConfig.{field} must be an int >= 1, got {value!r}")
    if self.vocab < MIN_VOCAB_SIZE:
      raise ConfigError(f"TrainConfig.vocab must be >= {MIN_VOCAB_SIZE} (256 bytes + end-of-text), got {self.vocab}")
    if not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
      raise ConfigError(f"TrainConfig.warmup must be an int in [0, steps={self.steps}], got {self.warmup!r}")
    if not self.lr > 0:
      raise ConfigError(f"TrainConfig.lr must be > 0, got {self.lr!r}")
    if self.max_train_docs is not None and self.max_train_docs < 1:
      raise ConfigError(f"TrainConfig.max_train_docs must be >= 1 or None, got {self.max_train_docs!r}")
    if not self.out:
      raise ConfigError("TrainConfig.out must be a non-empty path")

  def model_config(self, vocab_size: int) -> ModelConfig:
    """The preset with the tokenizer's vocabulary, this run's recipe and room for `seq` tokens."""
    base = PRESETS[self.preset]
    return model_preset(self.preset, vocab_size=vocab_size, recipe=self.recipe,
                        max_seq_len=max(base.max_seq_len, self.seq), tp_partial_sums=self.tp_partial_sums)

  def optimizer_config(self) -> OptimizerConfig:
    return OptimizerConfig(lr=self.lr, total_steps=self.steps, warmup_steps=self.warmup)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "TrainConfig":
    return cls(**d)

  def resume_mismatches(self, saved: "TrainConfig") -> list[str]:
    """Fields (other than RESUMABLE_CHANGES) in which `saved` differs from this config."""
    mine, theirs = self.to_dict(), saved.to_dict()
    return [f"{k}: {theirs[k]!r} -> {mine[k]!r}" for k in mine if k not in RESUMABLE_CHANGES and mine[k] != theirs[k]]
