"""Per-process batch placement: which rows of each global batch [B, S+1] this process loads.

With several processes (after `jax.distributed.initialize`) the batch is sharded over
(data, fsdp) and every process loads only the rows its own devices hold.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding

from s3r import data as s3r_data
from s3r.train.config import ConfigError


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
