"""`python -m benchmarks maxtext`: s3r's MaxText backend next to MaxText's own `quantization=int8` (AQT).

Needs MaxText (`pip install -e '.[maxtext]'`). One tiny Llama-style MaxText model (MaxText's `base.yml`
with the sizes below), built once per `quantization=` value and given the initial weights of the `int8`
one (see `_same_weights`), trains in lockstep on the same batches of real text, bytes as tokens (vocabulary 256):
each step runs every configuration once, in an order that rotates per step, so the step times are
interleaved samples of one run. The step is a jitted NNX step around MaxText's model (next-byte
cross-entropy, AdamW), the same for every configuration; only `quantization` differs.

Configurations (`--configs`, MaxText `quantization` values; "" is MaxText unquantized, bf16 compute):
  ""               MaxText without quantization
  int8             MaxText's AQT int8 (its `_get_int8_quant_config`)
  s3r:bf16         s3r's unquantized recipe through the backend (the baseline of s3r's comparisons)
  s3r:s3r_ec_dx    s3r's recommended recipe through the backend

Reported: median step time after `--skip` steps and its ratio to `int8` (paired per step), the
training loss (mean of the last 10 steps) and the validation loss on held-out text after the last step.

`--model NAME --layers L` replaces the tiny model by MaxText's own config of a released model
(`model_name=NAME`, e.g. `llama3.1-8b`) sliced to L decoder layers at full width: the device stage
(`scripts/device_maxtext.sh`). `--tokens DIR` reads a token folder (`train.npy`, `val.npy`, as
`python -m research.lockstep build-tokens` writes) instead of bytes of the enwiki shards. The results
files are rewritten after every step (marked partial), so a run stopped by a time limit keeps its steps.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from labtools.results import RESULTS_DIR, Run, fmt_ms, fmt_ratio, loadavg, log, markdown_table

DEFAULT_CONFIGS = ",int8,s3r:bf16,s3r:s3r_ec_dx"
REFERENCE = "int8"
MODEL = dict(
  base_emb_dim=256,
  base_num_query_heads=4,
  base_num_kv_heads=4,
  head_dim=64,
  base_mlp_dim=1024,
  base_num_decoder_layers=2,
  vocab_size=256,
  attention="dot_product",
  dataset_type="synthetic",
  skip_jax_distributed_system=True,
  enable_tensorboard=False,
  enable_checkpointing=False,
  enable_dropout=False,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated MaxText quantization values")
  p.add_argument("--steps", type=int, default=60, help="training steps per configuration (lockstep)")
  p.add_argument("--skip", type=int, default=5, help="first steps left out of the step times (compilation)")
  p.add_argument("--batch", type=int, default=4, help="sequences per step")
  p.add_argument("--seq", type=int, default=128, help="tokens (bytes) per sequence")
  p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (constant)")
  p.add_argument("--seed", type=int, default=0, help="initialization seed (MaxText init_weights_seed) and batch order")
  p.add_argument("--val-batches", type=int, default=4, help="held-out batches for the validation loss")
  p.add_argument("--data", default=None, help="folder of enwiki shards (default: <data root>/enwiki)")
  p.add_argument("--tokens", default=None, help="token folder (train.npy, val.npy) to read instead of enwiki bytes")
  p.add_argument("--model", default=None, help="MaxText model_name (e.g. llama3.1-8b) instead of the tiny model")
  p.add_argument("--layers", type=int, default=None, help="decoder layers of --model (default: its own)")
  p.add_argument("--width", type=int, default=None, help="shrink --model to this width (dry runs; 2 heads)")
  p.add_argument("--vocab", type=int, default=None, help="vocabulary of --model (dry runs; default: its own)")
  p.add_argument("--attention", default=None, help="MaxText attention (default: dot_product)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_maxtext_<platform>.{json,md} go (default %(default)s)"
  )


def _byte_batches(path: pathlib.Path, batch: int, seq: int, count: int, seed: int) -> np.ndarray:
  """`count` batches [batch, seq + 1] of byte tokens cut at random offsets from the documents of `path`."""
  from s3r.data.sources import read_documents

  data, size = [], 0
  need = max(50 * batch * (seq + 1), 4_000_000)
  for doc in read_documents(path):
    data.append(np.frombuffer(doc.encode("utf-8"), np.uint8))
    size += data[-1].size
    if size >= need:
      break
  stream = np.concatenate(data).astype(np.int32)
  starts = np.random.default_rng(seed).integers(0, stream.size - seq - 1, (count, batch))
  return np.stack([[stream[s : s + seq + 1] for s in row] for row in starts])


def _token_batches(path: pathlib.Path, batch: int, seq: int, count: int, seed: int) -> np.ndarray:
  """`count` batches [batch, seq + 1] cut at random offsets from a token array (`train.npy`, `val.npy`)."""
  stream = np.load(path, mmap_mode="r")
  if stream.size <= seq + 1:
    raise SystemExit(f"benchmarks maxtext: {path} holds {stream.size} tokens, fewer than one sequence of {seq + 1}")
  starts = np.random.default_rng(seed).integers(0, stream.size - seq - 1, (count, batch))
  return np.stack([[np.asarray(stream[s : s + seq + 1], np.int32) for s in row] for row in starts])


def _batches(args) -> tuple[np.ndarray, np.ndarray]:
  """(train, validation) batches: from `--tokens` if given, else bytes of the enwiki shards."""
  if args.tokens:
    folder = pathlib.Path(args.tokens)
    if not (folder / "train.npy").exists() or not (folder / "val.npy").exists():
      raise SystemExit(f"benchmarks maxtext: --tokens {folder} needs train.npy and val.npy")
    cut = _token_batches
    train_path, val_path = folder / "train.npy", folder / "val.npy"
  else:
    cut = _byte_batches
    train_path, val_path = _shards(args)
  train = cut(train_path, args.batch, args.seq, args.steps, args.seed)
  return train, cut(val_path, args.batch, args.seq, args.val_batches, args.seed + 1)


def model_settings(args) -> dict:
  """MaxText config values of the model: the tiny one, or `--model` sliced to `--layers`."""
  if args.model is None:
    return dict(MODEL, attention=args.attention or MODEL["attention"])
  out = {k: v for k, v in MODEL.items() if not k.startswith("base_") and k not in ("head_dim", "vocab_size")}
  out |= dict(model_name=args.model, attention=args.attention or MODEL["attention"])
  if args.layers is not None:
    out["base_num_decoder_layers"] = args.layers
  if args.width is not None or args.vocab is not None:  # MaxText refuses such overrides unless asked to allow them
    out["override_model_config"] = True
  if args.width is not None:
    w = args.width
    out |= dict(base_emb_dim=w, base_mlp_dim=2 * w, base_num_query_heads=2, base_num_kv_heads=1, head_dim=w // 2)
  if args.vocab is not None:
    out["vocab_size"] = args.vocab
  return out


def _shards(args) -> tuple[pathlib.Path, pathlib.Path]:
  from s3r.data.sources import locate_data_root

  root = pathlib.Path(args.data) if args.data else (locate_data_root()[0] or pathlib.Path("missing")) / "enwiki"
  train, val = root / "enwiki-00000-of-00010.jsonl.gz", root / "enwiki-00009-of-00010.jsonl.gz"
  if not (train.exists() and val.exists()):
    raise SystemExit(f"benchmarks maxtext: needs the enwiki shards 0 and 9 under {root} (--data)")
  return train, val


def _build(value: str, args):
  """(model, optimizer, jitted step, jitted eval, MaxText config) for one quantization value."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from maxtext.configs import pyconfig
  from maxtext.utils import maxtext_utils_nnx, model_creation_utils

  base = str(pathlib.Path(pyconfig.__file__).parent / "base.yml")
  kw = model_settings(args) | dict(run_name="bench", base_output_directory="runs/maxtext_bench", quantization=value)
  kw |= dict(max_target_length=args.seq, per_device_batch_size=args.batch, init_weights_seed=args.seed)
  cfg = pyconfig.initialize(["", base], **kw)
  model = model_creation_utils.from_config(cfg, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))
  opt = nnx.Optimizer(model, optax.adamw(args.lr), wrt=nnx.Param)
  positions = jnp.broadcast_to(jnp.arange(args.seq), (args.batch, args.seq))
  segments = jnp.ones((args.batch, args.seq), jnp.int32)

  def loss_fn(m, tokens):
    logits = m(decoder_input_tokens=tokens[:, :-1], decoder_positions=positions, decoder_segment_ids=segments)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  @nnx.jit
  def step(m, o, tokens):
    loss, grads = nnx.value_and_grad(loss_fn)(m, tokens)
    o.update(m, grads)
    return loss

  return model, opt, step, nnx.jit(loss_fn), cfg


def _same_weights(built: dict, source: str) -> None:
  """Gives every model the initial parameters of `source`'s. MaxText's Linen-to-NNX bridge forks the RNG
  streams when a layer has a quantization object, so the unquantized model would start elsewhere."""
  from flax import nnx

  params = nnx.state(built[source][0], nnx.Param)
  for c, (model, *_rest) in built.items():
    if c != source:
      nnx.update(model, params)


def run(args: argparse.Namespace) -> dict:
  import jax

  from s3r.integrations import maxtext as smt

  smt.register()
  configs = args.configs.split(",")
  if REFERENCE not in configs:
    raise SystemExit(f"benchmarks maxtext: --configs must include {REFERENCE!r} (the reference of the ratios)")
  train, val = _batches(args)
  keys = ("configs", "steps", "skip", "batch", "seq", "lr", "seed", "val_batches", "model", "layers", "width", "vocab")
  settings = {k: getattr(args, k) for k in keys} | {"data": "tokens" if args.tokens else "enwiki bytes"}
  run_ = Run("maxtext" if args.model is None else f"maxtext_{args.model}", args.out_dir, **settings)
  run_.settings["model_config"] = model_settings(args)
  built = {}
  for c in configs:
    t0 = time.perf_counter()
    built[c] = _build(c, args)
    log(f"[maxtext] built {c or 'none'} in {time.perf_counter() - t0:.1f} s")
  _same_weights(built, REFERENCE)
  vocab = int(built[REFERENCE][4].vocab_size)
  if max(int(train.max()), int(val.max())) >= vocab:
    raise SystemExit(f"benchmarks maxtext: the tokens reach {int(train.max())}, beyond the model's vocabulary {vocab}")
  times = {c: [] for c in configs}
  losses = {c: [] for c in configs}
  log(f"[maxtext] {len(configs)} configs x {args.steps} steps, load {loadavg()}")
  for i in range(args.steps):
    tokens = jax.numpy.asarray(train[i])
    for c in configs[i % len(configs) :] + configs[: i % len(configs)]:  # rotate the order per step
      model, opt, step, *_ = built[c]
      t0 = time.perf_counter()
      loss = float(step(model, opt, tokens))
      times[c].append(time.perf_counter() - t0)
      losses[c].append(loss)
    if i % 10 == 0 or i == args.steps - 1:
      log(f"  step {i}: " + ", ".join(f"{c or 'none'} {losses[c][-1]:.3f}" for c in configs))
    partial = _summary(configs, times, losses, args, {})
    run_.write(partial, markdown(partial, args), complete=False)  # a time limit keeps the steps that ran
  val_losses = {}
  for c in configs:
    eval_fn = built[c][3]
    val_losses[c] = float(np.mean([float(eval_fn(built[c][0], jax.numpy.asarray(b))) for b in val]))
  results = _summary(configs, times, losses, args, val_losses)
  paths = run_.write(results, markdown(results, args))
  log(f"[maxtext] wrote {', '.join(str(p) for p in paths.values())}")
  return {"results": results, "paths": paths}


def _summary(configs, times, losses, args, val_losses: dict) -> dict:
  """Per configuration: median step time after `skip`, its paired ratio to int8, losses (NaN before any
  step past `skip`; val_loss NaN until the evaluation after the last step)."""
  results = {}
  ref = np.asarray(times[REFERENCE][args.skip :])
  for c in configs:
    t = np.asarray(times[c][args.skip :])
    results[c or "none"] = {
      "quantization": c,
      "steps_run": len(times[c]),
      "step_s_median": float(np.median(t)) if t.size else float("nan"),
      "step_vs_int8_paired": float(np.median(t / ref)) if t.size else float("nan"),
      "train_loss_last10": float(np.mean(losses[c][-10:])),
      "val_loss": val_losses.get(c, float("nan")),
      "losses": losses[c],
      "step_s": times[c],
    }
  return results


def markdown(results: dict, args) -> str:
  rows = [
    [
      f"`{name}`" if r["quantization"] else "none (bf16)",
      fmt_ms(r["step_s_median"]),
      fmt_ratio(r["step_vs_int8_paired"]),
      f"{r['train_loss_last10']:.3f}",
      "n/a" if np.isnan(r["val_loss"]) else f"{r['val_loss']:.3f}",
    ]
    for name, r in results.items()
  ]
  head = ["quantization=", "median step ms", "step / int8 (paired)", "train loss (last 10)", "val loss"]
  return "\n".join(
    [
      f"## {_model_title(args)}, {args.steps} lockstep steps of {args.batch} x {args.seq} "
      + ("tokens" if args.tokens else "bytes (enwiki)"),
      "",
      markdown_table(head, rows, align=["l", "r", "r", "r", "r"]),
      "",
      f"Step times: medians after the first {args.skip} steps; the ratio is the median over steps of the "
      "per-step ratio to `int8` (MaxText's AQT), measured in the same run, configurations interleaved. "
      + ("Validation: the token folder's val.npy" if args.tokens else "Validation: held-out enwiki shard 9")
      + ", after the last step. One seed.",
      "",
    ]
  )


def _model_title(args) -> str:
  if args.model is None:
    return "Tiny MaxText model"
  title = f"MaxText `{args.model}`" + ("" if args.layers is None else f" sliced to {args.layers} layers")
  return title + ("" if args.width is None else f" at width {args.width} (a dry run)")
