"""BatchLoader and eval_batches: packing, shuffling, resuming, sharding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from s3r.data import BatchLoader, DataError, Tokenizer, eval_batches, prepare, split_documents

SEQ = 7  # windows of 8 tokens


def _stream(n: int) -> np.ndarray:
  """Tokens 0..n-1, so every window's position in the stream is readable."""
  return np.arange(n, dtype=np.uint16)


def test_packing_yields_contiguous_windows_with_eot_between_documents(
  tmp_path, write_jsonl, make_docs, no_data_root, log
):
  docs = make_docs(40)
  path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in docs])
  c = prepare(str(path), vocab_size=300, cache_dir=tmp_path / "cache", log=log)
  tok: Tokenizer = c.tokenizer
  train_docs = [docs[i] for i in split_documents(docs, 0.05)[0]]
  expected = np.concatenate([np.r_[tok.encode(d), tok.eot_id] for d in train_docs])
  np.testing.assert_array_equal(c.train_tokens, expected)  # docs joined, EOT after each
  width = SEQ + 1
  windows = c.train_tokens[: len(expected) // width * width].reshape(-1, width).astype(np.int32)
  loader = BatchLoader(c.train_tokens, batch_size=4, seq_len=SEQ, seed=0)
  for _ in range(3):
    for row in loader.next():  # every row is one aligned, contiguous window of the stream
      assert (windows == row).all(axis=1).any()


def test_batches_are_int32_windows_of_seq_len_plus_one():
  loader = BatchLoader(_stream(1000), batch_size=6, seq_len=SEQ, seed=1)
  batch = loader.next()
  assert batch.shape == (6, SEQ + 1) and batch.dtype == np.int32
  assert (batch[:, 0] % (SEQ + 1) == 0).all()  # windows are aligned and non-overlapping
  assert (np.diff(batch, axis=1) == 1).all()  # and contiguous
  inputs, targets = batch[:, :-1], batch[:, 1:]
  np.testing.assert_array_equal(inputs + 1, targets)


def test_each_epoch_visits_each_window_at_most_once_in_a_new_order():
  loader = BatchLoader(_stream(8 * 50 + 3), batch_size=8, seq_len=SEQ, seed=3)
  assert (loader.n_windows, loader.batches_per_epoch) == (50, 6)
  epochs = [np.concatenate([loader.next()[:, 0] for _ in range(6)]) for _ in range(2)]
  for firsts in epochs:
    assert len(set(firsts.tolist())) == 48 and firsts.max() < 50 * 8
  assert loader.epoch == 1 and not np.array_equal(epochs[0], epochs[1])


def test_shuffle_is_deterministic_by_seed():
  def batches(seed):
    loader = BatchLoader(_stream(4000), batch_size=4, seq_len=SEQ, seed=seed)
    return np.stack([loader.next() for _ in range(5)])

  np.testing.assert_array_equal(batches(7), batches(7))
  assert not np.array_equal(batches(7), batches(8))
  assert not np.array_equal(batches(7)[:, :, 0].ravel(), np.sort(batches(7)[:, :, 0].ravel()))


@pytest.mark.parametrize("steps_before", [0, 3, 11, 25])  # 12 batches per epoch
def test_loader_restore_replays_the_same_batches(steps_before):
  tokens = _stream(8 * 48 + 5)
  original = BatchLoader(tokens, batch_size=4, seq_len=SEQ, seed=5)
  for _ in range(steps_before):
    original.next()
  state = json.loads(json.dumps(original.state()))
  assert {"seed", "epoch", "position"} <= set(state)
  expected = [original.next() for _ in range(20)]  # crosses an epoch boundary
  resumed = BatchLoader(tokens, batch_size=4, seq_len=SEQ, seed=999)
  resumed.restore(state)
  for want in expected:
    np.testing.assert_array_equal(resumed.next(), want)


def test_restore_rejects_state_from_different_data():
  state = BatchLoader(_stream(1000), batch_size=4, seq_len=SEQ, seed=0).state()
  with pytest.raises(ValueError, match="n_tokens"):
    BatchLoader(_stream(2000), batch_size=4, seq_len=SEQ, seed=0).restore(state)


def test_process_slices_partition_the_global_batch():
  tokens = _stream(5000)
  full = BatchLoader(tokens, batch_size=8, seq_len=SEQ, seed=2)
  shards = [BatchLoader(tokens, batch_size=8, seq_len=SEQ, seed=2, process_index=i, process_count=4) for i in range(4)]
  for _ in range(10):
    parts = [s.next() for s in shards]
    assert all(p.shape == (2, SEQ + 1) for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), full.next())


def test_indivisible_batch_size_raises_value_error():
  with pytest.raises(ValueError, match="batch_size=6.*process_count=4"):
    BatchLoader(_stream(5000), batch_size=6, seq_len=SEQ, seed=0, process_count=4)
  with pytest.raises(ValueError, match="process_index"):
    BatchLoader(_stream(5000), batch_size=8, seq_len=SEQ, seed=0, process_index=4, process_count=4)


def test_too_few_tokens_raises_data_error_with_the_numbers():
  with pytest.raises(DataError, match=r"30 tokens make 3 windows.*batch_size=4"):
    BatchLoader(_stream(30), batch_size=4, seq_len=SEQ, seed=0)
  with pytest.raises(DataError, match="too few evaluation tokens"):
    eval_batches(_stream(30), batch_size=4, seq_len=SEQ)


def test_eval_batches_are_deterministic_and_in_stream_order():
  tokens = _stream(8 * 21)
  batches = list(eval_batches(tokens, batch_size=5, seq_len=SEQ))
  assert len(batches) == 4 and all(b.shape == (5, SEQ + 1) and b.dtype == np.int32 for b in batches)
  np.testing.assert_array_equal(np.concatenate(batches).ravel(), np.arange(8 * 20))
  again = list(eval_batches(tokens, batch_size=5, seq_len=SEQ))
  assert all(np.array_equal(a, b) for a, b in zip(batches, again))


def test_eval_max_batches_spreads_over_the_stream_in_order():
  tokens = _stream(8 * 100)
  firsts = [int(b[0, 0]) for b in eval_batches(tokens, batch_size=2, seq_len=SEQ, max_batches=5)]
  assert len(firsts) == 5 and firsts == sorted(firsts)
  assert firsts[0] == 0 and firsts[-1] == 8 * 98  # first and last batch of the 50
  assert len(list(eval_batches(tokens, batch_size=2, seq_len=SEQ, max_batches=500))) == 50
