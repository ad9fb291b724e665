"""What each process of a run loads: its rows of every batch, the corpus, the loss history.

With several processes (after `jax.distributed.initialize`) the batch is sharded over
(data, fsdp) and every process loads only the rows its own devices hold (`Batches`). Process 0
prepares the corpus first and every process checks that its copy matches (`prepare_data_once`);
process 0 reads the run's loss history on resume and sends it to all (`loss_history`).
"""

from __future__ import annotations

import hashlib
import pathlib

import jax
import numpy as np
from jax.sharding import NamedSharding

from s3r import data as s3r_data
from s3r.train.builder import prepare_data
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import report


def is_main_process() -> bool:
  """True in process 0 (the only one that writes metrics, config, plots and logs)."""
  return jax.process_index() == 0


def _row_range(index: tuple[slice, ...] | None, rows: int) -> tuple[int, int]:
  """[start, stop) of the `rows` batch rows that a device's index (its slices of the batch) covers."""
  assert index is not None  # a NamedSharding gives every addressable device a slice
  return index[0].start or 0, rows if index[0].stop is None else index[0].stop


class Batches:
  """Global batch arrays [B, S+1] built from the rows this process's devices hold.

  The devices of this process hold a contiguous range of rows [start, stop) (the mesh is
  laid out process by process), so the process loads just those rows: the BatchLoader's
  process slice `start // (stop - start)` of `B // (stop - start)`, and
  `jax.make_array_from_process_local_data` assembles the global array. One process: the
  whole batch.
  """

  def __init__(self, sharding: NamedSharding, shape: tuple[int, int]):
    self.sharding, self.shape = sharding, tuple(shape)
    indices = sharding.addressable_devices_indices_map(self.shape).values()
    rows = sorted({_row_range(index, shape[0]) for index in indices})
    self.start, self.stop = rows[0][0], rows[-1][1]
    n = self.stop - self.start
    if any(a > b_prev for (_, b_prev), (a, _) in zip(rows, rows[1:])) or shape[0] % n or self.start % n:
      raise ConfigError(
        f"the devices of process {jax.process_index()} hold rows {rows} of the batch, not one "
        f"contiguous block of an even split; use a mesh whose data x fsdp axes follow the processes"
      )
    self.rows = self.stop - self.start
    self.slice_index, self.slice_count = self.start // self.rows, shape[0] // self.rows

  def loader(self, tokens, *, seed: int) -> s3r_data.BatchLoader:
    """A BatchLoader that returns this process's rows of every global batch."""
    return s3r_data.BatchLoader(
      tokens,
      batch_size=self.shape[0],
      seq_len=self.shape[1] - 1,
      seed=seed,
      process_index=self.slice_index,
      process_count=self.slice_count,
    )

  def from_local(self, rows: np.ndarray) -> jax.Array:
    """The global array from this process's rows (as the loader returns them)."""
    return jax.make_array_from_process_local_data(self.sharding, np.asarray(rows), self.shape)

  def from_global(self, batch: np.ndarray) -> jax.Array:
    """The global array from a whole batch that every process has (validation batches)."""
    return self.from_local(np.asarray(batch)[self.start : self.stop])


def loss_history(out: pathlib.Path, start: int, main: bool) -> list[float]:
  """The training losses of steps 0..start from the run's metrics, which process 0 writes and reads; with
  several processes it sends them to all, so that every process's divergence guard decides alike."""
  history = [r["loss"] for r in report.read_metrics(out / report.METRICS_FILE) if r["step"] <= start] if main else []
  if jax.process_count() == 1:
    return history
  from jax.experimental import multihost_utils

  n = int(multihost_utils.broadcast_one_to_all(np.int32(len(history))))
  losses = np.zeros(n, np.float32)
  losses[: len(history)] = history
  return [float(v) for v in multihost_utils.broadcast_one_to_all(losses)]


def prepare_data_once(cfg: TrainConfig, log) -> s3r_data.Corpus:
  """The corpus; with several processes, process 0 prepares (and caches) it first, and every
  process checks that it has the same tokenizer and token counts as process 0."""
  if jax.process_count() == 1:
    return prepare_data(cfg, log)
  from jax.experimental import multihost_utils

  corpus = prepare_data(cfg, log) if is_main_process() else None
  multihost_utils.sync_global_devices("s3r: corpus prepared")
  if corpus is None:
    corpus = prepare_data(cfg, log)
  digest = hashlib.sha256(corpus.tokenizer.hf.to_str().encode())
  digest.update(np.asarray([len(corpus.train_tokens)] + [len(v) for v in corpus.val_tokens.values()]).tobytes())
  mine = np.frombuffer(digest.digest()[:8], np.int64)
  every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)
  if not np.all(every == every[0]):
    raise ConfigError(
      "the processes prepared different corpora or tokenizers; give every process the same "
      "--data and a shared --cache-dir"
    )
  return corpus
