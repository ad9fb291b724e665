"""The byte-level BPE tokenizer wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from s3r.data import EOT, Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
  text = [
    "The quick brown fox jumps over the lazy dog. " * 20,
    "def f(x):\n    return x + 1\n" * 20,
    "Ünïcödé — naïve café, 東京 🙂 " * 5,
  ]
  return Tokenizer.train(text, vocab_size=320)


@pytest.mark.parametrize(
  "text",
  [
    "The quick brown fox.",
    "  leading and  double  spaces\n\n\ttabs\r\n",
    "Ünïcödé — naïve café, 東京 🙂",
    "never seen: ʁʒ ∮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "",
  ],
)
def test_tokenizer_roundtrips_text(tok, text):
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text
  assert tok.decode(np.asarray(ids, np.uint16)) == text


def test_tokenizer_learns_merges_up_to_the_vocab_size(tok):
  assert tok.vocab_size == 320
  assert len(tok.encode("The quick brown fox")) < len(b"The quick brown fox")


def test_end_of_text_is_one_special_token_with_id_0(tok):
  assert tok.eot_id == 0
  assert tok.decode([tok.eot_id]) == EOT
  assert tok.decode([tok.eot_id], skip_special_tokens=True) == ""
  # The literal string in ordinary text is not turned into the special token.
  assert tok.eot_id not in tok.encode("a " + EOT + " b")


def test_encode_batch_matches_encode(tok):
  texts = ["one two", "three", "🙂 four"]
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_tokenizer_save_and_load_preserve_ids(tok, tmp_path):
  path = tmp_path / "tok" / "tokenizer.json"
  tok.save(path)
  loaded = Tokenizer.load(path)
  text = "The lazy dog returns x + 1 🙂"
  assert (loaded.vocab_size, loaded.eot_id) == (tok.vocab_size, tok.eot_id)
  assert loaded.encode(text) == tok.encode(text)


def test_too_small_vocab_raises_value_error():
  with pytest.raises(ValueError, match="vocab_size"):
    Tokenizer.train(["abc"], vocab_size=100)


def test_long_documents_are_encoded_in_pieces_with_the_same_ids():
  import random

  from s3r.data import cache
  from s3r.data.tokenizer import Tokenizer

  rng = random.Random(0)
  words = "alpha beta  gamma delta, epsilon. zeta\neta theta\n\n iota".split(" ")
  doc = " ".join(rng.choice(words) for _ in range(40_000))
  tok = Tokenizer.train([doc[:50_000]], 400)
  pieces = cache.split_long_document(doc, 5_000)
  assert "".join(pieces) == doc and len(pieces) > 20 and max(map(len, pieces)) <= 5_000
  assert [i for p in pieces for i in tok.encode(p)] == tok.encode(doc)
