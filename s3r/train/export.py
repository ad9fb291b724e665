"""`export_run`: a run's checkpoint as a Hugging Face checkpoint folder (`s3r export`, s3r.model.save_hf).

The tokenizer written beside the weights is the run's: the --init-from checkpoint's own files when the
run was imported (kept in <run>/tokenizer/), else the run's byte-level BPE as tokenizer.json with a
tokenizer_config.json naming `<|endoftext|>` as both BOS and EOS, and a text starting with it (as the
run's documents do after the one before). The `config.json` of an imported run is the --init-from
checkpoint's, every field carried through but those training changed (s3r.model.hf.save_hf's `source`).
"""

from __future__ import annotations

import pathlib

from s3r import model as s3r_model
from s3r.model.hf.save import SHARD_BYTES
from s3r.train.config import ConfigError
from s3r.train.evaluate import restore_run
from s3r.train.loop import TOKENIZER_DIR

DTYPES = {"bf16": "bfloat16", "f32": "float32"}  # `s3r export --dtype` -> the stored dtype


def export_run(
  path: str,
  out: str | pathlib.Path,
  *,
  step: int | None = None,
  dtype: str = "bf16",
  max_shard_bytes: int = SHARD_BYTES,
  log=print,
) -> pathlib.Path:
  """Writes checkpoint `step` (default: the newest readable) of the run at `path` into the new folder `out`
  (`dtype`: bf16 or f32); returns `out`. ConfigError (one line) for an `out` that exists and is not an empty
  folder, before anything is read; nothing is left in `out` when the export fails."""
  out = pathlib.Path(out)
  if out.exists() and not (out.is_dir() and not any(out.iterdir())):
    raise ConfigError(f"--out {out} exists and is not an empty folder; export into a new one")
  if dtype not in DTYPES:
    raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
  run = restore_run(path, step=step, log=log)
  own = run.directory.parent / TOKENIZER_DIR
  tok = run.tokenizer
  bpe = s3r_model.HFTokenizer(hf=tok.hf, bos_id=tok.eot_id, eos_id=tok.eot_id, add_bos=True)
  tokenizer = own if (own / "tokenizer.json").is_file() else bpe
  source = run.config.init_from
  if source is not None and not (pathlib.Path(source) / "config.json").is_file():
    log(f"export: {source}/config.json is gone; config.json is written from the model's config alone")
    source = None
  try:
    s3r_model.save_hf(
      out,
      run.setup.model_cfg,
      run.state.params,
      dtype=DTYPES[dtype],
      tokenizer=tokenizer,
      max_shard_bytes=max_shard_bytes,
      source=source,
    )
  except ValueError as e:  # a config transformers cannot compute, or an out that appeared meanwhile
    raise ConfigError(str(e)) from None
  log(f"export: step {run.step} of {run.directory} -> {out} ({DTYPES[dtype]})")
  return out
