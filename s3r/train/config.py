"""Configuration of one training run (what `s3r train` flags set: one flag per field, `flag(name)`,
generated from the fields and the help in their metadata).

Defaults that depend on the run are resolved when the config is built, so a saved config
holds concrete numbers: `vocab` and `seq` default to the preset's vocabulary and maximum
sequence length (`--preset tiny` trains the preset of that name, docs/models.md), `warmup` to
min(30, steps // 10). Errors name the command-line flag (`--warmup`) and the field.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from s3r.data.tokenizer import MIN_VOCAB_SIZE
from s3r.model import PRESETS, ModelConfig, hf_config
from s3r.model import preset as model_preset
from s3r.model.config import TP_PARTIAL_SUMS
from s3r.quant import DEFAULT_RECIPE
from s3r.quant.recipes import RecipeField
from s3r.train.run.profiling import ProfileError, parse_steps
from s3r.train.step.optimizer import OptimizerConfig


class ConfigError(ValueError):
  """A problem with what the user asked for (flags, mesh, run directory): reported in one line."""


# Fields that may differ between a run and its `--resume`: they do not change the numbers
# (the mesh changes only the order of some float reductions; see docs/scaling.md).
RESUMABLE_CHANGES = (
  "out",
  "resume",
  "eval_every",
  "eval_batches",
  "ckpt_every",
  "keep_every",
  "progress",
  "verbose",
  "cache_dir",
  "compile_cache",
  "mesh",
  "profile",
  "tensorboard",
  "wandb",
)
# Fields that may also change on `--resume` but change the numbers from then on: `steps` may grow (extending a
# run stretches the cosine schedule to the new total; see `TrainConfig.resume_mismatches`).
# `lr` may be lowered on `--resume` (e.g. after a divergence): recorded in `lr_changes` (`TrainConfig.resumed_at`).
EXTENDABLE = ("steps", "lr", "lr_changes")
DEFAULT_WARMUP = 30  # warm-up steps of a long run; short runs warm up for a tenth of their steps
MAX_LR = 1.0  # larger peak learning rates are refused as typos (AdamW steps are ~lr per parameter)
MAX_SEQ = 1 << 20  # longer sequences are refused before anything is compiled
_PRESET_SIZES = "; ".join(f"{name}: vocab {m.vocab_size}, seq {m.max_seq_len}" for name, m in PRESETS.items())


def _flag(default: Any, help: str, *, default_help: str | None = None, choices=None, metavar: str | None = None) -> Any:
  """A TrainConfig field that `s3r train` sets with flag(name): its metadata holds the flag's `help`, and
  `choices` and `metavar` where given. `default_help` says what the default is where the field's default
  (None) does not; the help of a bool field that defaults to True is that of its --no- flag."""
  metadata = {"help": help, "default_help": default_help, "choices": choices, "metavar": metavar}
  return dataclasses.field(default=default, metadata=metadata)


def field_flag(field: dataclasses.Field) -> str:
  """The command-line flag of a config field: "--warmup" for warmup, "--no-progress" for a bool field that
  defaults to True."""
  name = field.name.replace("_", "-")
  return f"--no-{name}" if field.default is True else f"--{name}"


def flag(field: str) -> str:
  """The `s3r train` flag of the TrainConfig field named `field` (`field_flag`)."""
  fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
  return field_flag(fields[field]) if field in fields else "--" + field.replace("_", "-")


def _error(field: str, requirement: str, value) -> ConfigError:
  return ConfigError(f"{flag(field)} must be {requirement}, got {value!r} (TrainConfig.{field})")


def default_warmup(steps: int) -> int:
  """The warm-up of a run of `steps` steps when none is given: min(30, steps // 10)."""
  return min(DEFAULT_WARMUP, steps // 10)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything a training run needs; saved in <out>/config.json and in every checkpoint."""

  out: str = _flag(dataclasses.MISSING, "run directory", default_help="runs/<preset>-<recipe>")
  preset: str = _flag("cpu-small", f"model size ({_PRESET_SIZES})", choices=tuple(PRESETS))
  recipe: RecipeField = _flag(  # a Recipe, or a name (parsed once, when the config is built)
    RecipeField(
      error=lambda value, e: _error("recipe", f"a recipe of `s3r recipes` (NAME or NAME@FORMAT): {e}", value)
    ),
    "quantization recipe of the block projections, NAME or NAME@FORMAT (see `s3r recipes`)",
    default_help=DEFAULT_RECIPE,
    metavar="NAME",
  )
  steps: int = _flag(300, "optimizer steps in the whole run; with --resume, a larger value extends the run")
  lr: float = _flag(
    2e-3,
    f"peak learning rate in (0, {MAX_LR:g}] (AdamW, cosine decay); with --resume, a lower value continues the run "
    "at that peak from the resumed step on (recorded in lr_changes)",
  )
  # (step, peak) of each --lr lowered on --resume at that step; set by resuming, not by a flag of its own
  lr_changes: tuple[tuple[int, float], ...] = dataclasses.field(default=(), metadata={"flag": False})
  warmup: int | None = _flag(None, "linear warm-up steps", default_help=f"min({DEFAULT_WARMUP}, steps // 10)")
  batch: int = _flag(8, "sequences per step (the global batch, over all devices and microbatches)")
  grad_accum: int = _flag(
    1,
    "microbatches per optimizer step: the step sums the f32 gradients of N microbatches of --batch / N "
    "sequences, one at a time (less activation memory, the same global batch); --batch must be divisible by "
    "N x the data-parallel size of the mesh",
    metavar="N",
  )
  seq: int | None = _flag(None, "tokens per sequence", default_help="the preset's maximum sequence length")
  init_from: str | None = _flag(
    None,
    "a Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json) to continue training: the model "
    "(--preset and --vocab are unused) and the tokenizer that encodes --data come from it; recorded in the run, "
    "so --resume reads only its config.json and tokenizer again",
    metavar="HF_DIR",
  )
  init_layers: int | None = _flag(
    None, "with --init-from, keep only the first N decoder layers (e.g. for a smoke test)", metavar="N"
  )
  data: str | None = _flag(
    None,
    "corpus: a file, directory or glob of .txt/.jsonl(.gz)/.parquet files, a folder written by Hugging Face "
    "datasets' save_to_disk (.parquet and datasets folders need pyarrow: pip install 's3r[parquet]'), or a name: "
    "enwiki, shakespeare "
    "(folders of the data root: $S3R_DATA, else ../shared/data beside the repository) or "
    "python-stdlib, which needs no data",
    default_help="enwiki if the data root has it, else python-stdlib",
  )
  text_column: str | None = _flag(
    None,
    "the column of a .parquet file or datasets folder (the field of a .jsonl record) that holds the text",
    default_help="text",
    metavar="NAME",
  )
  vocab: int | None = _flag(None, "tokenizer vocabulary size", default_help="the preset's vocabulary")
  max_train_docs: int | None = _flag(None, "use only the first N training documents")
  cache_dir: str = _flag(".cache/s3r", "tokenizer and token cache, and compiled programs (in its xla folder)")
  compile_cache: bool = _flag(
    True,
    "no persistent compilation cache: compile every program afresh (by default compiled programs are kept in "
    "<cache-dir>/xla, or in $JAX_COMPILATION_CACHE_DIR where set, and a repeated or resumed run loads them; "
    "the log says 'from the compilation cache' where it did)",
  )
  seed: int = _flag(0, "seed of parameters, quantizer noise and batch order")
  eval_every: int = _flag(100, "validation loss every N steps (and at step 0 and the end)")
  eval_batches: int = _flag(16, "batches per validation set")
  ckpt_every: int = _flag(100, "checkpoint every N steps (and at the end and on Ctrl-C)")
  keep_every: int | None = _flag(
    None,
    "also keep every checkpoint whose step is a multiple of N, a multiple of --ckpt-every (for analysis "
    "along the run, e.g. python -m research.dose_trajectory)",
    default_help="only the last two checkpoints and the newest known-good one",
    metavar="N",
  )
  resume: bool = _flag(False, "continue the run in --out with its own settings (see below)")
  mesh: str | None = _flag(
    None,
    "device mesh over all devices of all processes: axes data, expert, fsdp, tensor, e.g. "
    "data=2,fsdp=2,tensor=2 or expert=4,data=2 (expert: MoE experts sharded); on CPU, simulate N devices "
    "with XLA_FLAGS=--xla_force_host_platform_device_count=N; with --resume, the run's own, or one that fits "
    "the devices present when that does not",
    default_help="one device",
  )
  tp_partial_sums: str = _flag(
    "bf16",
    "under a tensor axis, the GEMM contracting the split dimension of a projection rounds each "
    "shard's output to bf16 before the cross-shard sum (bf16, as the paper), or sums exact int32 "
    "accumulators (int32: bitwise independent of the tensor-parallel degree)",
    choices=TP_PARTIAL_SUMS,
  )
  progress: bool = _flag(True, "no progress bar")
  verbose: bool = _flag(False, "library logs (Orbax, JAX) on the console too (they always go to <out>/train.log)")
  profile: str | None = _flag(
    None,
    "trace the steps START to STOP (both included) with jax.profiler into <out>/profile, for XProf or "
    "TensorBoard's profile plugin (docs/training.md)",
    metavar="START:STOP",
  )
  tensorboard: bool = _flag(
    True,
    "no TensorBoard event files (by default, with tensorboardX installed, <out> holds the scalars of every step: "
    "tensorboard --logdir <out>)",
  )
  wandb: str | None = _flag(
    None,
    "also log every step's scalars to this Weights & Biases project (needs the wandb package; "
    "WANDB_MODE=offline keeps them in <out>/wandb)",
    metavar="PROJECT",
  )

  def __post_init__(self):
    for field, allowed in (("preset", PRESETS), ("tp_partial_sums", TP_PARTIAL_SUMS)):
      if getattr(self, field) not in allowed:
        raise _error(field, f"one of {', '.join(allowed)}", getattr(self, field))
    base = PRESETS[self.preset]
    self._check_model_recipe(base)
    for field, default in (("vocab", base.vocab_size), ("seq", base.max_seq_len)):
      if getattr(self, field) is None:
        object.__setattr__(self, field, default)
    for field in ("steps", "batch", "grad_accum", "seq", "vocab", "eval_every", "eval_batches", "ckpt_every", "seed"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < (0 if field == "seed" else 1):
        raise _error(field, "an integer >= " + ("0" if field == "seed" else "1"), value)
    if self.batch % self.grad_accum:
      raise _error("batch", f"divisible by {flag('grad_accum')}={self.grad_accum}", self.batch)
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
    if self.text_column is not None and (not isinstance(self.text_column, str) or not self.text_column.strip()):
      raise _error("text_column", "a column name (or unset)", self.text_column)
    for field in ("max_train_docs", "init_layers", "keep_every"):
      value = getattr(self, field)
      if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise _error(field, "an integer >= 1 (or unset)", value)
    if self.keep_every is not None and self.keep_every % self.ckpt_every:
      raise _error("keep_every", f"a multiple of {flag('ckpt_every')}={self.ckpt_every}", self.keep_every)
    if self.init_layers is not None and self.init_from is None:
      raise _error("init_layers", f"unset without {flag('init_from')}", self.init_layers)
    if not self.out:
      raise _error("out", "a non-empty path", self.out)
    object.__setattr__(self, "lr_changes", _lr_changes(self.lr_changes, self.steps))
    if self.wandb is not None and not (isinstance(self.wandb, str) and self.wandb.strip()):
      raise _error("wandb", "a project name", self.wandb)
    if self.profile is not None:
      try:
        parse_steps(self.profile, flag=flag("profile"), last_step=self.steps)
      except ProfileError as e:
        raise ConfigError(f"{e} (TrainConfig.profile)") from None

  def _check_model_recipe(self, base: ModelConfig) -> None:
    """ConfigError naming --recipe unless the model runs it (an MoE model refuses FP4 gradient formats): the
    preset `base`, or with --init-from the checkpoint's config (its folder unreadable: the import says why)."""
    if self.init_from is not None:
      try:
        base = hf_config(self.init_from, **{k: v for k, v in self.import_overrides().items() if k != "recipe"})
      except ValueError:
        return
    try:
      dataclasses.replace(base, recipe=self.recipe)
    except ValueError as e:
      raise _error("recipe", f"a recipe the {self.model_name} model can run ({e})", self.recipe.name) from None

  @property
  def current_lr(self) -> float:
    """The peak learning rate in effect at the end of the run: the last of `lr_changes`, else `lr`."""
    return self.lr_changes[-1][1] if self.lr_changes else self.lr

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

  @property
  def model_name(self) -> str:
    """What the run trains, for logs and plots: the preset, or the folder name of --init-from."""
    return self.preset if self.init_from is None else f"{os.path.basename(os.path.normpath(self.init_from))} (imported)"

  def import_overrides(self) -> dict:
    """The fields of the --init-from checkpoint's config that this run replaces (s3r.model.hf_config)."""
    fields: dict[str, Any] = {"recipe": self.recipe, "tp_partial_sums": self.tp_partial_sums}
    if self.init_layers is not None:
      fields["n_layers"] = self.init_layers
    return fields

  def model_config(self, vocab_size: int, **overrides) -> ModelConfig:
    """The preset with the tokenizer's vocabulary, this run's recipe and room for `seq` tokens;
    `overrides` replace further fields as in `s3r.model.preset` (e.g. n_layers=2, remat=True).
    With --init-from: the checkpoint's config (its own vocabulary, which must hold the tokenizer's)."""
    if self.init_from is not None:
      cfg = hf_config(self.init_from, **{**self.import_overrides(), **overrides})
      if vocab_size > cfg.vocab_size:
        raise ConfigError(f"{self.init_from}: the tokenizer has {vocab_size} ids, the model {cfg.vocab_size}")
      return dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, self.seq_len))
    base = PRESETS[self.preset]
    fields = {
      "vocab_size": vocab_size,
      "recipe": self.recipe,
      "max_seq_len": max(base.max_seq_len, self.seq_len),
      "tp_partial_sums": self.tp_partial_sums,
    }
    return model_preset(self.preset, **{**fields, **overrides})

  def optimizer_config(self) -> OptimizerConfig:
    return OptimizerConfig(
      lr=self.lr, total_steps=self.steps, warmup_steps=self.warmup_steps, lr_changes=self.lr_changes
    )

  def to_dict(self) -> dict:
    """The fields as JSON values (the recipe by its name); `from_dict` reads them back."""
    return {**dataclasses.asdict(self), "recipe": self.recipe.name}

  @classmethod
  def from_dict(cls, d: dict) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})

  def resume_mismatches(self, saved: TrainConfig, *, at_step: int = 0) -> list[str]:
    """What in this config may not differ from `saved` when resuming at `at_step`: every field but
    RESUMABLE_CHANGES, `steps` only when it is lower than `at_step` (a larger `steps` extends the run:
    the cosine decay is stretched to the new total from `at_step` on), and `lr` only when it is above the
    peak in effect (a lower one is a schedule change from `at_step` on: `resumed_at`)."""
    mine, theirs = self.to_dict(), saved.to_dict()
    out = [
      f"{flag(k)}: {theirs[k]!r} -> {mine[k]!r}"
      for k in mine
      if k not in RESUMABLE_CHANGES + EXTENDABLE and mine[k] != theirs[k]
    ]
    if self.steps < at_step:
      out.append(f"--steps: {self.steps} is below the checkpoint's step {at_step}")
    if self.lr_changes != saved.lr_changes:
      out.append("--lr-changes: the recorded learning-rate changes may not be edited (lower --lr instead)")
    elif self.lr != saved.lr and self.lr > saved.current_lr:
      out.append(f"--lr: {saved.current_lr!r} -> {self.lr!r} (on --resume the peak may only be lowered)")
    return out

  def resumed_at(self, saved: TrainConfig, step: int) -> TrainConfig:
    """This config as the continuation of `saved` at `step`: a lower `lr` becomes `saved.lr` plus the change
    (step, lr) in `lr_changes` (the schedule is the old one up to `step`, the new peak after it)."""
    if self.lr == saved.lr or self.lr >= saved.current_lr:
      return dataclasses.replace(self, lr=saved.lr, lr_changes=saved.lr_changes)
    kept = tuple(change for change in saved.lr_changes if change[0] < step)  # changes after `step` were undone
    return dataclasses.replace(self, lr=saved.lr, lr_changes=(*kept, (step, float(self.lr))))


def _lr_changes(changes, steps: int) -> tuple[tuple[int, float], ...]:
  """`changes` ((step, peak) pairs, lists from JSON too) as a tuple of tuples; ConfigError unless the steps
  increase within [0, steps) and the peaks are in (0, MAX_LR]."""
  try:
    pairs = tuple((step, peak) for step, peak in changes)
  except (TypeError, ValueError):
    raise _error("lr_changes", "(step, peak) pairs", changes) from None
  previous = -1
  for step, peak in pairs:
    if not isinstance(step, int) or isinstance(step, bool) or not previous < step < steps:
      raise _error("lr_changes", f"pairs with increasing steps in [0, --steps={steps})", changes)
    if not (isinstance(peak, (int, float)) and math.isfinite(peak) and 0 < peak <= MAX_LR):
      raise _error("lr_changes", f"pairs with peaks in (0, {MAX_LR:g}]", changes)
    previous = step
  return tuple((step, float(peak)) for step, peak in pairs)
