"""One tokenization convention per tokenizer, from its config (docs/models.md, "Tokenization"): whether a
text starts with BOS (Llama 3 by its post-processor, Gemma 3 and DeepSeek-V2 by `add_bos_token`, Qwen3
never), and the same ids for the fine-tuning data, an evaluation, `s3r generate RUN` and `s3r generate
HF_DIR` (of the imported folder and of an export)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, processors

from s3r import data as s3r_data
from s3r import model as M
from s3r.data import cache as s3r_cache
from s3r.model.hf.save import _write_tokenizer
from s3r.train import builder, evaluate
from s3r.train.config import TrainConfig
from tests.model import family_facts

WORDS = ["the", "lazy", "dog", "jumps", "over", "a", "fox"]


def _folder(tmp_path: pathlib.Path, *, bos: str | None, eos: str, post_bos: bool, config: dict) -> pathlib.Path:
  """A checkpoint folder's tokenizer files: a word-level tokenizer whose post-processor adds `bos` when
  `post_bos`, and a tokenizer_config.json with the BOS/EOS tokens and `config`'s fields."""
  special = [t for t in ("<unk>", bos, eos) if t is not None]
  vocab = {t: i for i, t in enumerate([*special, *WORDS])}
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(special)
  if post_bos:
    assert bos is not None
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
  folder = tmp_path / "hf"
  folder.mkdir()
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "eos_token": eos, **config}))
  return folder


# (family, BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config fields, starts with BOS)
FAMILIES = [(name, *facts.TOKENIZER) for name, facts in family_facts.FACTS.items() if facts.TOKENIZER] + [
  ("config_says_no", "<s>", "</s>", True, {"add_bos_token": False}, False),
]


@pytest.mark.parametrize("family, bos, eos, post_bos, config, starts", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_starts_a_text_with_bos_as_its_tokenizer_config_says(
  tmp_path, family, bos, eos, post_bos, config, starts
):
  folder = _folder(tmp_path, bos=bos, eos=eos, post_bos=post_bos, config=config)
  hf = M.load_hf_tokenizer(folder)
  assert hf.add_bos is starts
  words = hf.encode("the lazy dog", add_special_tokens=False)
  assert hf.prompt("the lazy dog") == ([hf.bos_id] if starts else []) + words

  # fine-tuning data (`s3r train --init-from`): [BOS] text EOS per document, concatenated
  cfg = TrainConfig(out=str(tmp_path / "run"), init_from=str(folder))
  tok = builder.hf_tokenizer(cfg)
  docs = ["the lazy dog", "a fox jumps"]
  stream = s3r_cache.encode_documents(docs, tok, np.dtype(np.int32), "val", lambda *_: None).tolist()
  start = [hf.bos_id] if starts else []
  want = [*start, *words, hf.eos_id, *start, *hf.encode("a fox jumps", add_special_tokens=False), hf.eos_id]
  assert stream == want
  assert [i for d in docs for i in tok.document(tok.encode(d))] == want  # what `s3r eval RUN --data` encodes

  # `s3r generate RUN` reads the tokenizer back from a checkpoint's meta: the same prompt ids as HF_DIR
  meta = {"tokenizer": tok.hf.to_str(), "eot": tok.eot, "bos": tok.bos, "train_config": {"init_from": str(folder)}}
  assert evaluate.checkpoint_tokenizer(meta).prompt("the lazy dog") == hf.prompt("the lazy dog")
  # the token cache of a family with BOS is not the one of the same tokenizer without
  if starts:
    assert (
      s3r_cache.given_tokenizer_info(tok)["cache_key"]
      != s3r_cache.given_tokenizer_info(s3r_data.Tokenizer(tok.hf, tok.eot, released=True))["cache_key"]
    )


def test_a_trained_tokenizers_prompt_starts_after_end_of_text_in_the_run_and_in_its_export(tmp_path):
  tok = s3r_data.Tokenizer.train(["the lazy dog jumps over a fox"] * 20, 300)
  meta = {"tokenizer": tok.hf.to_str(), "eot": tok.eot, "bos": None, "train_config": {"init_from": None}}
  run_prompt = evaluate.checkpoint_tokenizer(meta).prompt("the lazy dog")
  assert run_prompt == [tok.eot_id, *tok.encode("the lazy dog")]
  # `s3r export` writes it with <|endoftext|> as BOS and a text starting with it
  (tmp_path / "exported").mkdir()
  _write_tokenizer(
    tmp_path / "exported", M.HFTokenizer(hf=tok.hf, bos_id=tok.eot_id, eos_id=tok.eot_id, add_bos=True), 64
  )
  exported = M.load_hf_tokenizer(tmp_path / "exported")
  assert exported.prompt("the lazy dog") == run_prompt
  assert exported.encode("the lazy dog") == run_prompt  # its post-processor adds it too, as transformers reads it


def test_a_checkpoint_without_a_recorded_bos_keeps_generating_as_it_trained(tmp_path):
  folder = _folder(tmp_path, bos="<bos>", eos="<eos>", post_bos=True, config={"add_bos_token": True})
  hf = M.load_hf_tokenizer(folder)
  meta = {"tokenizer": hf.hf.to_str(), "eot": "<eos>", "train_config": {"init_from": str(folder)}}  # no "bos"
  assert evaluate.checkpoint_tokenizer(meta).prompt("the lazy dog") == hf.encode(
    "the lazy dog", add_special_tokens=False
  )
