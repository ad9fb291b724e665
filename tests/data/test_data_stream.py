"""A corpus named by a path is split, sampled and encoded a piece at a time: its documents are read from the files
on every pass and its token arrays are memory-mapped from the cache, so its size is bounded by the disk."""

from __future__ import annotations

import functools
import random
import tracemalloc

import numpy as np
import pytest

from s3r.data import arrow as s3r_arrow
from s3r.data import cache, prepare, read_documents, split_documents
from s3r.data.stream import SplitDocuments

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def test_the_streamed_splits_hold_the_documents_the_list_split_chooses(tmp_path, make_docs, write_jsonl, no_data_root):
  docs = make_docs(80)
  path = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
  corpus = prepare(str(path), vocab_size=300, cache_dir=tmp_path / "cache", max_train_docs=50, log=lambda _: None)
  train_idx, val_idx = split_documents(list(read_documents(path)), 0.05)
  expected = cache.encode_documents([docs[i] for i in train_idx][:50], corpus.tokenizer, np.dtype(np.uint16), "", print)
  assert np.array_equal(corpus.train_tokens, expected) and isinstance(corpus.train_tokens, np.memmap)
  assert corpus.info["n_docs"] == {"train": 50, "val": len(val_idx)}
  assert corpus.info["n_chars"]["train"] == sum(len(docs[i]) for i in train_idx[:50])


def test_a_split_is_read_again_on_every_pass_and_a_corpus_that_shrank_meanwhile_is_an_error(tmp_path, write_jsonl):
  path = write_jsonl(tmp_path / "c.jsonl", [{"text": f"doc {i}"} for i in range(6)])
  split = SplitDocuments([path], str(path), None, [True, False, True, True, False, True], [5] * 6, limit=3)
  assert (len(split), split.n_chars) == (3, 15)
  assert list(split) == list(split) == ["doc 0", "doc 2", "doc 3"]
  write_jsonl(path, [{"text": "doc 0"}])
  with pytest.raises(Exception, match="changed while it was read"):
    list(split)


def test_preparing_a_corpus_holds_a_few_of_its_pieces_in_memory_not_the_corpus(tmp_path, monkeypatch, no_data_root):
  """9 MB of Parquet text (2,000 documents in row groups of 50) prepared with a 300 kB tokenizer sample, 100 kB
  encoding chunks and record batches of 50 rows: Python's peak allocation stays below a quarter of the text (a
  list of the documents alone would be all of it, and the tokens in memory about a half)."""
  pa = pytest.importorskip("pyarrow", reason="the Parquet corpus needs pyarrow (pip install 's3r[parquet]')")
  import pyarrow.parquet as pq

  rng = random.Random(0)
  docs = [f"{i} " + " ".join(rng.choice(WORDS) for _ in range(800)) for i in range(2000)]
  text_bytes = sum(len(d) for d in docs)
  pq.write_table(pa.table({"text": docs}), tmp_path / "c.parquet", row_group_size=50)
  del docs
  monkeypatch.setattr(cache, "tokenizer_sample", functools.partial(cache.tokenizer_sample, max_chars=300_000))
  monkeypatch.setattr(cache, "_ENCODE_CHUNK_CHARS", 100_000)
  monkeypatch.setattr(s3r_arrow, "BATCH_ROWS", 50)
  tracemalloc.start()
  try:
    corpus = prepare(str(tmp_path / "c.parquet"), vocab_size=300, cache_dir=tmp_path / "cache", log=lambda _: None)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert isinstance(corpus.train_tokens, np.memmap) and len(corpus.train_tokens) > text_bytes // 8
  assert peak < text_bytes / 4, (peak, text_bytes)
