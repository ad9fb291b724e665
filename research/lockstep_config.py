"""What a lockstep run is given: its settings (`LockstepConfig`) and its token folder (`build_tokens` writes
one, `load_tokens` reads it), small enough to travel with the device's working-tree copy. `research/lockstep.py`
runs it."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from s3r import data as s3r_data
from s3r import model as s3r_model

LAYOUT_FILES = ("train.npy", "val.npy", "meta.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockstepConfig:
  """One lockstep run (what the `run` flags set)."""

  data: str  # folder written by `build-tokens`
  out: str  # output folder (curves.jsonl, summary.json, lockstep.log)
  preset: str = "paper-12l"  # model preset (s3r.model.PRESETS); the vocabulary is the token folder's
  recipes: tuple[str, ...] = ("int8_sr", "s3r", "s3r_ec_dx")  # recipes trained side by side
  steps: int = 2000  # length of the learning-rate schedule; with fit_budget, the longest schedule allowed
  fit_budget: bool = False  # size a complete schedule to the steps that fit in time_budget (see the module doc)
  batch: int = 8  # sequences per step
  seq: int = 2048  # tokens per sequence
  lr: float = 6e-4  # peak learning rate, the same for every recipe
  warmup: int = 200  # linear warm-up steps (then cosine decay to lr/10); fit_budget scales it with the schedule
  seed: int = 0  # parameters, quantizer keys and batch order
  eval_every: int = 250  # validation every N steps (and at the stop)
  eval_batches: int = 16  # fixed validation batches per set
  time_budget: float = 420.0  # seconds from the start (compilation included) after which no step starts
  margin: float = 10.0  # seconds kept free for the last evaluation and the files
  attention: str = "auto"  # attention kernel: auto (cuDNN flash attention on GPUs if it compiles, else XLA), xla, cudnn
  # ModelConfig.tp_partial_sums: on one device both give the same program; "int32" passes no split to the
  # projections, which the FP4 gradient formats need (they refuse a column split)
  tp_partial_sums: str = "bf16"
  compile_threads: int = 0  # parallel compilations (0: one per recipe)
  dose_keys: int = 4  # quantizer keys of the final gradient-error measurement (0: skip it)
  dose_batch: int = 2  # sequences of the batch it uses
  dose_params_of: str = ""  # a recipe: also measure every recipe's errors on its final parameters ("": skip)
  precompiled: str = ""  # folder of train steps compiled ahead of time (labtools/executables.py; "": compile)

  def __post_init__(self):
    if self.preset not in s3r_model.PRESETS:
      raise ValueError(f"LockstepConfig.preset must be one of {', '.join(s3r_model.PRESETS)}; got {self.preset!r}")
    if len(set(self.recipes)) != len(self.recipes) or len(self.recipes) < 2:
      raise ValueError(f"LockstepConfig.recipes must be at least two distinct recipes, got {self.recipes!r}")
    for field in ("steps", "batch", "seq", "eval_every", "eval_batches", "dose_batch"):
      value = getattr(self, field)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"LockstepConfig.{field} must be an int >= 1, got {value!r}")
    if not isinstance(self.warmup, int) or not 0 <= self.warmup <= self.steps:
      raise ValueError(f"LockstepConfig.warmup must be an int in [0, steps={self.steps}], got {self.warmup!r}")
    for field in ("lr", "time_budget"):
      if not getattr(self, field) > 0:
        raise ValueError(f"LockstepConfig.{field} must be > 0, got {getattr(self, field)!r}")
    if self.tp_partial_sums not in ("bf16", "int32"):
      raise ValueError(f"LockstepConfig.tp_partial_sums must be bf16 or int32, got {self.tp_partial_sums!r}")
    if self.attention not in ("auto", "xla", "cudnn"):
      raise ValueError(f"LockstepConfig.attention must be auto, xla or cudnn, got {self.attention!r}")
    if self.dose_params_of and self.dose_params_of not in self.recipes:
      raise ValueError(
        f"LockstepConfig.dose_params_of must be one of the recipes {list(self.recipes)} or empty, "
        f"got {self.dose_params_of!r}"
      )
    for field in ("compile_threads", "dose_keys"):
      if not isinstance(getattr(self, field), int) or getattr(self, field) < 0:
        raise ValueError(f"LockstepConfig.{field} must be an int >= 0, got {getattr(self, field)!r}")


# --- token folder -------------------------------------------------------------------------------


def build_tokens(
  out: str, *, data: str | None, vocab: int, cache_dir: str, max_train_tokens: int | None, log=print
) -> dict:
  """Tokenize `data` (None: enwiki, shards 0-8 train, shard 9 val) with the project's tokenizer and
  write the token folder; the training stream is cut to `max_train_tokens` (whole stream if None)."""
  corpus = s3r_data.prepare(data, vocab_size=vocab, cache_dir=cache_dir, log=log)
  folder = pathlib.Path(out)
  folder.mkdir(parents=True, exist_ok=True)
  dtype = np.uint16 if corpus.tokenizer.vocab_size <= 65536 else np.int32
  train = np.asarray(corpus.train_tokens[:max_train_tokens], dtype)
  np.save(folder / "train.npy", train)
  for name, tokens in corpus.val_tokens.items():
    np.save(folder / f"{name}.npy", np.asarray(tokens, dtype))
  (folder / "tokenizer.json").write_text(corpus.tokenizer.hf.to_str())
  sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
  meta = {
    "corpus": corpus.name,
    "split": corpus.info["split"],
    "vocab_size": corpus.tokenizer.vocab_size,
    "dtype": np.dtype(dtype).name,
    "n_tokens": {"train": int(len(train)), **{k: int(len(v)) for k, v in corpus.val_tokens.items()}},
    "train_tokens_available": int(len(corpus.train_tokens)),
    "bytes": sizes,
  }
  (folder / "meta.json").write_text(json.dumps(meta, indent=2))
  log(f"token folder {folder}: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))
  return meta


def load_tokens(folder: str) -> tuple[dict, np.ndarray, dict[str, np.ndarray]]:
  """(meta, train tokens, {validation set: tokens}) of a token folder."""
  path = pathlib.Path(folder)
  missing = [f for f in LAYOUT_FILES if not (path / f).is_file()]
  if missing:
    raise FileNotFoundError(
      f"token folder {folder} lacks {', '.join(missing)}; build it with `python -m research.lockstep build-tokens`"
    )
  meta = json.loads((path / "meta.json").read_text())
  val = {p.stem: np.load(p, mmap_mode="r") for p in sorted(path.glob("*.npy")) if p.stem != "train"}
  return meta, np.load(path / "train.npy", mmap_mode="r"), val
