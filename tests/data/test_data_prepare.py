"""prepare(): corpus selection, train/val split, tokenizer and token caching."""

from __future__ import annotations

import json

import numpy as np
import pytest

from s3r.data import Corpus, DataError, prepare, sources, split_documents

VOCAB = 300


def _corpus_file(tmp_path, write_jsonl, make_docs, n=60):
  docs = make_docs(n)
  return write_jsonl(tmp_path / "corpus" / "docs.jsonl", [{"text": d} for d in docs]), docs


def _split_back_into_docs(corpus: Corpus, tokens: np.ndarray) -> list[str]:
  """Decode a token array into its documents (each is followed by EOT)."""
  eot = corpus.tokenizer.eot_id
  assert tokens[-1] == eot
  parts = np.split(tokens, np.flatnonzero(tokens == eot) + 1)[:-1]
  return [corpus.tokenizer.decode(part[:-1]) for part in parts]


def test_train_and_validation_share_no_document(tmp_path, write_jsonl, make_docs, no_data_root, log):
  path, docs = _corpus_file(tmp_path, write_jsonl, make_docs, n=80)
  c = prepare(str(path), vocab_size=VOCAB, cache_dir=tmp_path / "cache", val_fraction=0.2, log=log)
  train = _split_back_into_docs(c, c.train_tokens)
  val = _split_back_into_docs(c, c.val_tokens["val"])
  assert set(train).isdisjoint(val)
  assert sorted(train + val) == sorted(docs)  # every document is on exactly one side
  assert 5 <= len(val) <= 35  # about val_fraction of them
  assert list(c.val_tokens) == ["val"]  # no data root -> no c4 set


def test_split_is_deterministic_and_keeps_duplicates_together():
  docs = [f"document number {i}" for i in range(200)] + ["dup"] * 5
  train, val = split_documents(docs, 0.1)
  assert (train, val) == split_documents(list(docs), 0.1)
  assert sorted(train + val) == list(range(len(docs)))
  dup_idx = set(range(200, 205))
  assert dup_idx <= set(train) or dup_idx <= set(val)


def test_split_holds_out_at_least_one_and_keeps_at_least_one_document():
  for fraction in (1e-9, 0.999999):
    train, val = split_documents(["a", "b", "c"], fraction)
    assert train and val and sorted(train + val) == [0, 1, 2]


def test_single_document_corpus_raises_data_error(tmp_path, no_data_root):
  (tmp_path / "one.txt").write_text("just one document\n\nwith two paragraphs")
  with pytest.raises(DataError, match="need at least 2"):
    prepare(str(tmp_path / "one.txt"), vocab_size=VOCAB, cache_dir=tmp_path / "c", log=print)


def test_tokenizer_is_reused_from_cache(tmp_path, write_jsonl, make_docs, no_data_root, log):
  path, _ = _corpus_file(tmp_path, write_jsonl, make_docs)
  first = prepare(str(path), vocab_size=VOCAB, cache_dir=tmp_path / "cache", log=log)
  assert log.has("tokenizer: training") and not log.has("tokenizer: cached")
  log.clear()
  second = prepare(str(path), vocab_size=VOCAB, cache_dir=tmp_path / "cache", log=log)
  assert log.has("tokenizer: cached") and not log.has("tokenizer: training")
  assert log.has("tokens: cached train") and log.has("tokens: cached val")
  assert second.info["tokenizer"]["cached"] and not first.info["tokenizer"]["cached"]
  np.testing.assert_array_equal(first.train_tokens, second.train_tokens)
  np.testing.assert_array_equal(first.val_tokens["val"], second.val_tokens["val"])
  text = "the lazy dog quietly judges"
  assert first.tokenizer.encode(text) == second.tokenizer.encode(text)


def test_changed_corpus_or_vocab_gets_a_new_tokenizer(tmp_path, write_jsonl, make_docs, no_data_root, log):
  path, docs = _corpus_file(tmp_path, write_jsonl, make_docs)
  cache = tmp_path / "cache"
  prepare(str(path), vocab_size=VOCAB, cache_dir=cache, log=log)
  write_jsonl(path, [{"text": d} for d in docs] + [{"text": "one more document here"}])
  prepare(str(path), vocab_size=VOCAB, cache_dir=cache, log=log)
  prepare(str(path), vocab_size=VOCAB + 10, cache_dir=cache, log=log)
  assert sum("tokenizer: training" in line for line in log) == 3
  assert len(list((cache / "tokenizers").glob("*.json"))) == 3


def test_corpus_arrays_and_info_are_well_formed(tmp_path, write_jsonl, make_docs, no_data_root, log):
  path, _ = _corpus_file(tmp_path, write_jsonl, make_docs)
  c = prepare(str(path), vocab_size=VOCAB, cache_dir=tmp_path / "cache", max_train_docs=10, log=log)
  assert c.name == str(path) and c.tokenizer.vocab_size <= VOCAB
  for arr in (c.train_tokens, *c.val_tokens.values()):
    assert arr.ndim == 1 and arr.dtype == np.uint16 and arr.max() < c.tokenizer.vocab_size
  info = json.loads(json.dumps(c.info))
  assert info["n_docs"]["train"] == 10  # max_train_docs caps the training documents
  assert info["n_tokens"] == {"train": len(c.train_tokens), "val": len(c.val_tokens["val"])}
  assert info["vocab_size"] == c.tokenizer.vocab_size and info["files"]["train"] == [str(path)]
  assert info["tokenizer"]["cache_key"] and info["token_cache"]["train"]["cache_key"]


def test_default_corpus_is_enwiki_shards_with_c4_validation(tmp_path, write_jsonl, make_docs, monkeypatch, log):
  root = tmp_path / "root"
  for shard in range(3):
    write_jsonl(
      root / "enwiki" / f"enwiki-{shard:05d}-of-00003.jsonl.gz",
      [{"text": d} for d in make_docs(10, prefix=f"shard{shard}")],
    )
  write_jsonl(root / "c4" / "c4-sample-a.json.gz", [{"text": d} for d in make_docs(5, "web")])
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(root))
  c = prepare(None, vocab_size=VOCAB, cache_dir=tmp_path / "cache", log=log)
  assert c.name == "enwiki" and set(c.val_tokens) == {"val", "c4"}
  assert c.info["n_docs"] == {"train": 20, "val": 10, "c4": 5}
  val_text = c.tokenizer.decode(c.val_tokens["val"])
  assert "shard2" in val_text and "shard0" not in val_text  # last shard is validation
  assert "web" in c.tokenizer.decode(c.val_tokens["c4"])
  assert log.has("shards 0-1 train, shard 2 validation")


def test_named_corpus_is_looked_up_under_the_data_root(tmp_path, make_docs, monkeypatch, log):
  (tmp_path / "root" / "plays").mkdir(parents=True)
  (tmp_path / "root" / "plays" / "input.txt").write_text("\n\n\n".join(make_docs(20)))
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "root"))
  monkeypatch.chdir(tmp_path)
  c = prepare("plays", vocab_size=VOCAB, cache_dir=tmp_path / "cache", log=log)
  assert c.info["n_docs"]["train"] + c.info["n_docs"]["val"] == 20


def test_a_name_without_a_data_root_says_where_names_are_looked_up_and_offers_the_stdlib(tmp_path, no_data_root):
  with pytest.raises(DataError) as e:
    prepare("shakespeare", vocab_size=VOCAB, cache_dir=tmp_path / "cache")
  message = str(e.value)
  assert "--data shakespeare" in message and sources.DATA_DIR_ENV in message
  assert "python-stdlib" in message and "\n" not in message


def test_named_corpus_missing_under_an_existing_root_names_the_root(tmp_path, monkeypatch):
  (tmp_path / "root").mkdir()
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "root"))
  monkeypatch.chdir(tmp_path)
  with pytest.raises(DataError, match=r"data root .*root .* has no plays"):
    prepare("plays", vocab_size=VOCAB, cache_dir=tmp_path / "cache")


def test_tokenizer_training_sees_at_most_doc_chars_of_each_document():
  from s3r.data.cache import tokenizer_sample

  docs = ["x" * 50, "y" * 5000, "z" * 10]
  sample, stride = tokenizer_sample(docs, max_chars=10_000, doc_chars=100)
  assert stride == 1 and sample == ["x" * 50, "y" * 100, "z" * 10]
  sample, stride = tokenizer_sample(docs, max_chars=80, doc_chars=100)  # 160 capped chars -> every 2nd
  assert stride == 2 and sample == ["x" * 50, "z" * 10]


def test_stdlib_fallback_is_used_without_data_root(tmp_path, no_data_root, log):
  c = prepare(None, vocab_size=VOCAB, cache_dir=tmp_path / "cache", max_train_docs=20, log=log)
  assert c.name == "python-stdlib"
  assert log.has("no data root in this test") and log.has("Python standard library")
  assert c.info["n_docs"]["train"] == 20 and c.info["n_docs"]["val"] >= 1
  assert "def " in c.tokenizer.decode(c.train_tokens[:5000])


def test_invalid_arguments_raise_value_error(tmp_path, no_data_root):
  with pytest.raises(ValueError, match="val_fraction"):
    prepare(None, val_fraction=1.0, cache_dir=tmp_path)
  with pytest.raises(ValueError, match="max_train_docs"):
    prepare(None, max_train_docs=0, cache_dir=tmp_path)
  with pytest.raises(ValueError, match="vocab_size"):
    prepare(None, vocab_size=200, cache_dir=tmp_path)


def test_real_enwiki_is_the_default_corpus(real_data_root, tmp_path, log):
  c = prepare(None, vocab_size=VOCAB, cache_dir=tmp_path / "cache", max_train_docs=5, log=log)
  assert c.name == "enwiki" and "val" in c.val_tokens
  assert c.info["files"]["val"][0].endswith("enwiki-00009-of-00010.jsonl.gz")
  assert "c4" in c.val_tokens or not (real_data_root / "c4").is_dir()
  assert c.info["n_tokens"]["val"] > 1_000_000
