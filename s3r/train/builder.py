"""The compiled pieces of a run: mesh, model, shardings, jitted init/train/eval steps, and the
ahead-of-time compiled train step with its memory estimate.

PRNG keys: key(seed) is split into init (parameters; unused when they are imported, --init-from),
train (quantizer randomness, folded with the step number) and eval (forward-only passes need a key
for stochastic recipes but draw nothing from it).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import checkpoint, compile_cache
from s3r.train.step import TrainState, init_state, make_eval_step, make_train_step, sharding
from s3r.train.step.optimizer import make_optimizer, schedule


class ResourceError(RuntimeError):
  """The run does not fit the machine (memory, disk): reported in one line, exit code 3."""


@dataclasses.dataclass(frozen=True)
class Setup:
  """The compiled pieces of a run, built from its config and vocabulary."""

  model_cfg: s3r_model.ModelConfig
  mesh: jax.sharding.Mesh
  batch_sharding: NamedSharding
  abstract_state: TrainState  # ShapeDtypeStructs with shardings
  init_state: Callable[[jax.Array], TrainState]  # init_key -> TrainState
  train_step: jax.stages.Wrapped  # (state, batch, train_key) -> (state, metrics); donates state
  eval_step: jax.stages.Wrapped  # (params, batch, eval_key) -> loss
  keys: dict  # "init", "train", "eval"


def make_mesh(cfg: TrainConfig) -> jax.sharding.Mesh:
  """The mesh of `cfg.mesh`, checked against the devices and the batch size (ConfigError if not)."""
  try:
    mesh = sharding.make_mesh(sharding.parse_mesh(cfg.mesh, jax.device_count()))
    sharding.batch_sharding(mesh, cfg.batch_shape)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return mesh


def check_microbatches(cfg: TrainConfig, mesh: jax.sharding.Mesh) -> None:
  """ConfigError naming --batch and --grad-accum unless every microbatch splits evenly over the mesh's
  data-parallel devices (data x expert x fsdp)."""
  per_batch = mesh.shape["data"] * mesh.shape["expert"] * mesh.shape["fsdp"]
  if cfg.grad_accum > 1 and cfg.batch % (cfg.grad_accum * per_batch):
    raise ConfigError(
      f"--batch {cfg.batch} must be divisible by --grad-accum {cfg.grad_accum} x data x expert x fsdp = "
      f"{cfg.grad_accum * per_batch} of the mesh (every microbatch splits evenly over the data-parallel devices); "
      f"raise --batch or lower --grad-accum"
    )


def build(cfg: TrainConfig, vocab_size: int, mesh: jax.sharding.Mesh, **model_overrides) -> Setup:
  """Model, shardings and the jitted init/train/eval functions of `cfg` on `mesh`.

  `model_overrides` replace fields of the model config as in `s3r.model.preset` (e.g. n_layers=2 for
  `python -m benchmarks comm`; `python -m benchmarks step` also sets remat, attention_impl, d_model)."""
  check_microbatches(cfg, mesh)
  model_cfg = cfg.model_config(vocab_size, **model_overrides)
  batch_sh = sharding.batch_sharding(mesh, cfg.batch_shape)
  tx = make_optimizer(cfg.optimizer_config())
  graphdef = s3r_model.graphdef(model_cfg)
  fresh = lambda key: init_state(s3r_model.init_params(model_cfg, key), tx)
  shapes = jax.eval_shape(fresh, jax.random.key(0))
  state_sh = sharding.state_shardings(mesh, model_cfg, shapes, tx)
  replicated = NamedSharding(mesh, P())
  constrained = lambda fn: sharding.with_activation_sharding(fn, mesh)
  train_step = jax.jit(
    constrained(make_train_step(graphdef, tx, schedule(cfg.optimizer_config()), grad_accum=cfg.grad_accum)),
    in_shardings=(state_sh, batch_sh, replicated),
    out_shardings=(state_sh, replicated),
    donate_argnums=0,
  )
  eval_step = jax.jit(
    constrained(make_eval_step(graphdef)),
    in_shardings=(state_sh.params, batch_sh, replicated),
    out_shardings=replicated,
  )
  init_key, train_key, eval_key = jax.random.split(jax.random.key(cfg.seed), 3)
  if cfg.init_from is None:
    init = jax.jit(fresh, out_shardings=state_sh)
  else:  # the imported parameters (placed on their shardings as they are read) around a fresh optimizer state
    around = jax.jit(lambda params: init_state(params, tx), out_shardings=state_sh, donate_argnums=0)
    init = lambda _key: around(imported_params(cfg, state_sh.params))
  return Setup(
    model_cfg=model_cfg,
    mesh=mesh,
    batch_sharding=batch_sh,
    abstract_state=checkpoint.abstract_like(shapes, state_sh),
    init_state=init,
    train_step=train_step,
    eval_step=eval_step,
    keys={"init": init_key, "train": train_key, "eval": eval_key},
  )


def imported_params(cfg: TrainConfig, shardings) -> dict:
  """The parameters of the --init-from checkpoint, each placed on its sharding as it is read."""
  assert cfg.init_from is not None
  return s3r_model.load_hf(cfg.init_from, shardings=shardings, **cfg.import_overrides())[1]


def hf_tokenizer(cfg: TrainConfig) -> s3r_data.Tokenizer:
  """The --init-from checkpoint's tokenizer, its EOS token ending every document and, where the family starts
  a text with BOS (`HFTokenizer.add_bos`), its BOS token starting every document; ConfigError if it names no EOS."""
  assert cfg.init_from is not None
  tok = s3r_model.load_hf_tokenizer(cfg.init_from)
  eos = None if tok.eos_id is None else tok.hf.id_to_token(tok.eos_id)
  if eos is None:
    raise ConfigError(f"{cfg.init_from}: tokenizer_config.json names no eos_token (it ends every document)")
  bos = tok.hf.id_to_token(tok.bos_id) if tok.add_bos and tok.bos_id is not None else None
  return s3r_data.Tokenizer(tok.hf, eos, bos=bos, released=True)


def prepare_data(cfg: TrainConfig, log=print) -> s3r_data.Corpus:
  """The run's corpus, encoded with its tokenizer: trained on it, or --init-from's."""
  return s3r_data.prepare(
    cfg.data,
    vocab_size=cfg.vocab_size,
    cache_dir=cfg.cache_dir,
    max_train_docs=cfg.max_train_docs,
    text_column=cfg.text_column,
    tokenizer=None if cfg.init_from is None else hf_tokenizer(cfg),
    log=log,
  )


def lower_train_step(setup: Setup, cfg: TrainConfig) -> jax.stages.Lowered:
  """The train step lowered for `cfg`'s batch shape on the run's shardings (from abstract values:
  nothing is allocated)."""
  batch = jax.ShapeDtypeStruct(cfg.batch_shape, np.int32, sharding=setup.batch_sharding)
  return setup.train_step.lower(setup.abstract_state, batch, setup.keys["train"])


def compile_train_step(setup: Setup, cfg: TrainConfig, log):
  """The train step compiled ahead of time (so that step times exclude compilation), refused with a
  ResourceError when its memory estimate exceeds what one device has free: before compiling when the
  attention scores alone (`attention_scores_bytes`) cannot fit, else from the compiled program's estimate."""
  free = free_device_memory()
  floor = attention_scores_bytes(setup, cfg)
  if free is not None and floor > free:
    raise ResourceError(
      f"the train step needs more than {floor / 2**30:.1f} GiB per device (the attention scores of one layer "
      f"at seq {cfg.seq_len}) and {free / 2**30:.1f} GiB is free; lower --batch or --seq, or add devices (--mesh)"
    )
  compiled = _compiled("train", lambda: lower_train_step(setup, cfg), log)
  need = step_memory_bytes(compiled)
  if need is not None and free is not None and need > free:
    raise ResourceError(
      f"the train step needs about {need / 2**30:.1f} GiB per device and {free / 2**30:.1f} GiB "
      f"is free; lower --batch or --seq, or add devices (--mesh)"
    )
  return compiled


def compile_eval_step(setup: Setup, cfg: TrainConfig, log):
  """The eval step (params, batch, eval key) -> loss compiled ahead of time for batches of `cfg`."""
  batch = jax.ShapeDtypeStruct(cfg.batch_shape, np.int32, sharding=setup.batch_sharding)
  return _compiled("eval", lambda: setup.eval_step.lower(setup.abstract_state.params, batch, setup.keys["eval"]), log)


def compile_eval_step_on_first_use(setup: Setup, cfg: TrainConfig, log) -> Callable:
  """The eval step, compiled by `compile_eval_step` (which says so) when it is first called: a run that
  never evaluates never compiles it."""
  compiled = []

  def eval_step(params, batch, key):
    if not compiled:
      compiled.append(compile_eval_step(setup, cfg, log))
    return compiled[0](params, batch, key)

  return eval_step


def _compiled(name: str, lower: Callable[[], jax.stages.Lowered], log):
  """`lower()` compiled, saying so before (a large model compiles for minutes) and after, and whether it was
  loaded from JAX's persistent compilation cache (`compile_cache`)."""
  log(f"compiling the {name} step ...")
  t0, loads = time.time(), compile_cache.loads()
  compiled = lower().compile()
  cached = " (from the compilation cache)" if compile_cache.loads() > loads else ""
  log(f"compiled the {name} step in {time.time() - t0:.1f}s{cached}")
  return compiled


def attention_scores_bytes(setup: Setup, cfg: TrainConfig) -> int:
  """A lower bound on the per-device memory of the train step with XLA attention: the scores of one
  layer, [batch / (grad_accum x data x expert x fsdp), heads / tensor, seq, seq] in bf16, exist at once (0 with cuDNN's
  fused attention, which never holds them)."""
  model_cfg, mesh = setup.model_cfg, setup.mesh.shape
  if model_cfg.attention_impl != "xla":
    return 0
  batch = -(-cfg.batch // (cfg.grad_accum * mesh["data"] * mesh["expert"] * mesh["fsdp"]))  # one microbatch's
  heads = model_cfg.n_heads // mesh["tensor"] if model_cfg.n_heads % mesh["tensor"] == 0 else model_cfg.n_heads
  return batch * heads * cfg.seq_len * cfg.seq_len * 2


def step_memory_bytes(compiled) -> int | None:
  """Bytes one device needs to run `compiled` (arguments + outputs - donated aliases + temporaries)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend reports it
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def free_device_memory() -> int | None:
  """Free memory of the first local device: its allocator's limit minus use, or the host's
  available memory on CPU (None if unknown)."""
  device = jax.local_devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
      return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return None
  try:
    with open("/proc/meminfo") as f:
      fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
    return pages * os.sysconf("SC_PAGE_SIZE") if pages else None
