"""`s3r generate`: a Hugging Face fixture and a tiny training run continued from the command line, and
its one-line errors (exit code 2)."""

from __future__ import annotations

import json
import pathlib
import random

import pytest

from s3r import cli
from s3r import model as M

LLAMA = pathlib.Path(__file__).parent / "model" / "fixtures_hf" / "llama"  # the fixture with a tokenizer


def _printed(capsys) -> list[dict]:
  return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_generate_continues_prompts_of_a_hugging_face_checkpoint_as_the_python_api_does(capsys):
  argv = ["generate", str(LLAMA), "--prompt", "the lazy dog", "--prompt", "a", "--max-new-tokens", "5", "--json"]
  assert cli.main(argv) == 0
  rows = _printed(capsys)
  tok = M.load_hf_tokenizer(LLAMA)
  cfg, params = M.load_hf(LLAMA, recipe="bf16", act_dtype="float32")
  want = M.generate(cfg, params, [tok.encode("the lazy dog"), tok.encode("a")], max_new_tokens=5)
  assert [r["prompt"] for r in rows] == ["the lazy dog", "a"]
  for row, tokens in zip(rows, want.tolist()):
    stop = tokens.index(tok.eos_id) + 1 if tok.eos_id in tokens else len(tokens)
    assert row["tokens"] == tokens[:stop]
    assert row["text"] == tok.decode([t for t in tokens[:stop] if t != tok.eos_id])


def test_sampling_from_the_command_line_is_reproducible_per_seed(capsys):
  argv = ["generate", str(LLAMA), "--prompt", "the lazy dog", "--max-new-tokens", "5", "--json", "--temperature", "1"]
  runs = []
  for seed in ("3", "3", "4"):
    assert cli.main([*argv, "--top-k", "4", "--seed", seed]) == 0
    runs.append(_printed(capsys)[0]["tokens"])
  assert runs[0] == runs[1] != runs[2]  # 5 draws among 4 tokens: equal across seeds with probability < 0.76**5


def _corpus(directory: pathlib.Path) -> pathlib.Path:
  rng = random.Random(1)
  words = "a small corpus of plain text files for the command line test of generation".split()
  directory.mkdir()
  docs = [" ".join(rng.choice(words) for _ in range(120)) + "." for _ in range(60)]
  (directory / "corpus.txt").write_text("\n\n\n".join(docs))
  return directory


def test_generate_continues_a_prompt_with_a_training_runs_checkpoint_and_tokenizer(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _corpus(tmp_path / "data")
  train = ["train", "--preset", "tiny", "--steps", "3", "--batch", "2", "--seq", "32", "--vocab", "300"]
  assert cli.main([*train, "--data", "data", "--out", "run", "--eval-batches", "1", "--no-progress"]) == 0
  capsys.readouterr()
  assert cli.main(["generate", "run", "--prompt", "a small", "--max-new-tokens", "4"]) == 0
  text = capsys.readouterr().out
  assert text.startswith("a small") and len(text) > len("a small\n")
  assert cli.main(["generate", "run", "--prompt", "a small", "--max-new-tokens", "4", "--json"]) == 0
  (row,) = _printed(capsys)
  assert 1 <= len(row["tokens"]) <= 4 and all(0 <= t < 300 for t in row["tokens"])
  assert text == "a small" + row["text"] + "\n\n"  # the same greedy tokens, shown as text
  assert cli.main(["generate", "run", "--prompt", "x", "--max-new-tokens", "100000"]) == 2  # past max_seq_len
  assert "exceeds the model's max_seq_len" in capsys.readouterr().err


@pytest.mark.parametrize(
  "args, message",
  [
    (["nowhere", "--prompt", "a"], "nowhere: no such folder"),
    ([str(LLAMA), "--prompt", ""], "--prompt is empty"),
    ([str(LLAMA), "--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
    ([str(LLAMA), "--prompt", "a", "--max-new-tokens", "-3"], "--max-new-tokens must be an integer >= 1, got -3"),
    ([str(LLAMA), "--prompt", "a", "--top-k", "0"], "--top-k must be an integer >= 1"),
    ([str(LLAMA), "--prompt", "a", "--dtype", "float16"], "invalid choice: 'float16'"),
    ([str(LLAMA.parent / "qwen3"), "--prompt", "a"], "tokenizer.json: no such file"),
  ],
)
def test_bad_generate_input_is_one_line_and_exit_code_2(args, message, capsys):
  try:
    code = cli.main(["generate", *args])
  except SystemExit as e:  # argparse's own refusals
    code = e.code
  err = capsys.readouterr().err
  assert code == 2 and message in err and err.count("\n") == 1, err
