"""Packing a token stream into training and evaluation batches.

The stream (documents joined by end-of-text tokens) is cut into non-overlapping
windows of ``seq_len + 1`` tokens: ``window[:-1]`` are the inputs and
``window[1:]`` the next-token targets. Documents are packed back to back, so a
window can span a document boundary (the EOT token between them tells the
model). The tail of the stream shorter than a window is not used.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from s3r.data.errors import DataError

_STATE_VERSION = 1


def _windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
  """View ``tokens`` as ``[n_windows, seq_len + 1]`` (no copy)."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 1:
    raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1, got {seq_len}")
  width = seq_len + 1
  n = len(tokens) // width
  return tokens[: n * width].reshape(n, width)


def _check_enough(windows: np.ndarray, n_tokens: int, batch_size: int, seq_len: int, what: str) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if len(windows) < batch_size:
    raise DataError(
      f"too few {what} tokens for one batch: {n_tokens:,} tokens make {len(windows):,} "
      f"windows of seq_len+1={seq_len + 1}, but batch_size={batch_size} needs "
      f"{batch_size * (seq_len + 1):,} tokens; use more data or a smaller batch/sequence"
    )


class BatchLoader:
  """Shuffled, resumable batches of packed windows for training.

  Each epoch visits the windows in the order of a permutation drawn from
  ``numpy.random.default_rng([seed, epoch])`` and serves
  ``n_windows // batch_size`` global batches of ``batch_size`` rows (the
  windows left over are different every epoch). With ``process_count > 1``
  every process builds the same global batch and returns its contiguous
  slice of rows ``[process_index * b, (process_index + 1) * b)`` where
  ``b = batch_size // process_count``.

  ``state()`` / ``restore()`` capture the position exactly: after restoring,
  ``next()`` returns the batches the original loader would have returned.
  """

  def __init__(
    self,
    tokens: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
  ):
    if process_count < 1 or not 0 <= process_index < process_count:
      raise ValueError(
        f"need 0 <= process_index < process_count, got process_index={process_index}, process_count={process_count}"
      )
    if batch_size % process_count:
      raise ValueError(f"batch_size={batch_size} is not divisible by process_count={process_count}")
    self._windows = _windows(tokens, seq_len)
    _check_enough(self._windows, len(tokens), batch_size, seq_len, "training")
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, int(seed)
    self.process_index, self.process_count = process_index, process_count
    self.local_batch_size = batch_size // process_count
    self.n_tokens = int(len(tokens))
    self.epoch, self.position = 0, 0
    self._perm_epoch, self._perm = -1, np.empty(0, np.int64)

  @property
  def n_windows(self) -> int:
    """Number of ``seq_len + 1`` windows in the stream."""
    return len(self._windows)

  @property
  def batches_per_epoch(self) -> int:
    """Global batches served per epoch."""
    return self.n_windows // self.batch_size

  def _permutation(self) -> np.ndarray:
    if self._perm_epoch != self.epoch:
      rng = np.random.default_rng([self.seed, self.epoch])
      self._perm, self._perm_epoch = rng.permutation(self.n_windows), self.epoch
    return self._perm

  def next(self) -> np.ndarray:
    """This process's rows of the next global batch: int32 ``[b, seq_len + 1]``."""
    if self.position >= self.batches_per_epoch:
      self.epoch, self.position = self.epoch + 1, 0
    start = self.position * self.batch_size + self.process_index * self.local_batch_size
    rows = self._permutation()[start : start + self.local_batch_size]
    self.position += 1
    return self._windows[rows].astype(np.int32)

  def __iter__(self) -> BatchLoader:
    return self

  def __next__(self) -> np.ndarray:
    return self.next()

  def state(self) -> dict:
    """JSON-serialisable position: seed, epoch, and batches served this epoch."""
    return {
      "version": _STATE_VERSION,
      "seed": self.seed,
      "epoch": self.epoch,
      "position": self.position,
      "batch_size": self.batch_size,
      "seq_len": self.seq_len,
      "n_tokens": self.n_tokens,
    }

  def restore(self, state: dict) -> None:
    """Continue from ``state`` (from :meth:`state` of a loader over the same tokens).

    The process layout may differ (it does not change the global batches);
    a different token count, batch size, or sequence length raises
    ``ValueError``, since the batches could not be replayed.
    """
    missing = [k for k in ("seed", "epoch", "position") if k not in state]
    if missing:
      raise ValueError(f"cannot restore loader state: missing {', '.join(missing)}")
    for key in ("batch_size", "seq_len", "n_tokens"):
      if key in state and state[key] != getattr(self, key):
        raise ValueError(
          f"cannot restore loader state: {key}={state[key]} in the state but {getattr(self, key)} in this loader"
        )
    self.seed, self.epoch, self.position = (int(state["seed"]), int(state["epoch"]), int(state["position"]))


def eval_batches(
  tokens: np.ndarray, *, batch_size: int, seq_len: int, max_batches: int | None = None
) -> Iterator[np.ndarray]:
  """Deterministic, unshuffled batches: int32 ``[batch_size, seq_len + 1]``.

  Without ``max_batches``, every full batch of consecutive windows, in
  stream order. With ``max_batches`` smaller than that number, that many of
  those batches, evenly spaced over the stream (still in order), so a capped
  evaluation covers the whole set rather than its first documents. Raises
  :class:`DataError` (at the call) if there is not enough for one batch.
  """
  windows = _windows(tokens, seq_len)
  _check_enough(windows, len(tokens), batch_size, seq_len, "evaluation")
  if max_batches is not None and max_batches < 1:
    raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
  n = len(windows) // batch_size
  if max_batches is None or max_batches >= n:
    chosen = np.arange(n)
  else:
    chosen = np.unique(np.linspace(0, n - 1, max_batches).round().astype(np.int64))
  return (windows[i * batch_size : (i + 1) * batch_size].astype(np.int32) for i in chosen)
