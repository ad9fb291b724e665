"""Bad input to `s3r train`: one error line, exit code 2, nothing written or lost."""

from __future__ import annotations

import gzip
import os
import pathlib
import shutil
from collections.abc import Iterator

import pytest

from tests.faults.conftest import assert_one_line_error, snapshot
from tests.model.test_hf_import import FIXTURES

BAD_FLAGS = [
  (["--recipe", "fp4"], ["--recipe", "invalid choice: 'fp4'"]),
  (["--preset", "huge"], ["--preset", "invalid choice: 'huge'"]),
  (["--steps", "0"], ["--steps must be an integer >= 1, got 0"]),
  (["--steps", "-5"], ["--steps must be an integer >= 1, got -5"]),
  (["--seq", "1000000000"], ["--seq must be <= "]),
  (["--lr", "1e300"], ["--lr must be a finite number in (0, 1]"]),
  (["--steps", "20", "--warmup", "30"], ["--warmup must be an integer in [0, --steps=20]"]),
]  # the first case in a subprocess, the others in this process (tests/faults/conftest.py)


@pytest.mark.parametrize("args, fragments", BAD_FLAGS)
def test_bad_flags_are_refused_in_one_line_naming_the_flag(cli, tmp_path, args, fragments):
  here = args != BAD_FLAGS[0][0]
  proc = cli(*cli.train_args(tmp_path / "run")[:-2], "--out", tmp_path / "run", *args, in_process=here)
  assert_one_line_error(proc, 2, *fragments)
  assert not (tmp_path / "run").exists()


def test_an_fp4_gradient_format_for_an_imported_moe_checkpoint_is_refused_in_one_line_before_any_work(cli, tmp_path):
  moe = tmp_path / "qwen3_moe"  # the MoE fixture with the Llama fixture's tokenizer (the same 128 ids)
  shutil.copytree(FIXTURES / "qwen3_moe", moe)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(FIXTURES / "llama" / name, moe)
  shape = ["--steps", "2", "--batch", "2", "--seq", "32", "--data", cli.corpus, "--cache-dir", cli.cache]
  proc = cli("train", "--init-from", moe, "--recipe", "s3r@nvfp4", *shape, "--out", tmp_path / "run")
  line = assert_one_line_error(proc, 2, "--recipe must be a recipe the qwen3_moe (imported) model can run")
  assert "nvfp4 format (emulated in float32) works only in dense models" in line
  assert not (tmp_path / "run").exists()


def _write(kind: str, tmp: pathlib.Path) -> tuple[pathlib.Path, str]:
  """A broken corpus of `kind` and what its error names."""
  if kind == "missing":
    return tmp / "no-such-corpus.txt", "does not exist"
  if kind == "empty-file":
    (tmp / "empty.txt").write_text("")
    return tmp / "empty.txt", "is empty"
  if kind == "empty-dir":
    (tmp / "nothing").mkdir()
    return tmp / "nothing", "contains no supported files"
  if kind == "binary":
    (tmp / "blob.txt").write_bytes(bytes(range(256)) * 64)
    return tmp / "blob.txt", "not valid UTF-8"
  if kind == "malformed-jsonl":
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\n{"text": "cut off\n')
    return tmp / "bad.jsonl", "bad.jsonl:2: invalid JSON"
  if kind == "no-text-field":
    (tmp / "notext.jsonl.gz").write_bytes(gzip.compress(b'{"body": "a"}\n'))
    return tmp / "notext.jsonl.gz", 'no "text" field (keys: body)'
  if kind == "non-utf8":
    (tmp / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n\n\nna\u00efve".encode("latin-1"))
    return tmp / "latin1.txt", "not valid UTF-8"
  raise ValueError(kind)


BAD_CORPORA = ["missing", "empty-file", "empty-dir", "binary", "malformed-jsonl", "no-text-field", "non-utf8"]


@pytest.mark.parametrize("kind", BAD_CORPORA)
def test_bad_corpora_are_refused_in_one_line_and_leave_no_run_directory(cli, tmp_path, kind):
  data, fragment = _write(kind, tmp_path)
  proc = cli.train(tmp_path / "run", data=data, in_process=kind != BAD_CORPORA[0])  # one case in a subprocess
  assert_one_line_error(proc, 2, fragment)
  assert not (tmp_path / "run").exists()


def test_a_corpus_name_without_a_data_root_says_which_folder_it_needs(cli, tmp_path):
  proc = cli.train(tmp_path / "run", data="shakespeare")
  assert_one_line_error(proc, 2, "--data shakespeare", "$S3R_DATA", "python-stdlib")


def test_out_or_cache_dir_that_is_an_existing_file_is_refused(cli, tmp_path):
  (tmp_path / "file").write_text("keep me")
  assert_one_line_error(cli.train(tmp_path / "file"), 2, "--out", "is an existing file")
  proc = cli(*cli.train_args(tmp_path / "run")[:-4], "--cache-dir", tmp_path / "file", "--out", tmp_path / "run")
  assert_one_line_error(proc, 2, "--cache-dir", "is an existing file")
  assert (tmp_path / "file").read_text() == "keep me" and not (tmp_path / "run").exists()


@pytest.fixture
def read_only_dir(tmp_path) -> Iterator[pathlib.Path]:
  """A directory in which nothing can be created (chmod, or a read-only system folder for root)."""
  if os.geteuid() != 0:
    path = tmp_path / "locked"
    path.mkdir()
    path.chmod(0o555)
    yield path
    path.chmod(0o755)
    return
  for candidate in (pathlib.Path("/sys"), pathlib.Path("/proc/sys")):
    try:
      (candidate / "s3r-probe").mkdir()
    except OSError:
      yield candidate
      return
    (candidate / "s3r-probe").rmdir()
  pytest.skip("running as root with no read-only folder to write into")


def test_read_only_out_is_refused_in_one_line(cli, read_only_dir):
  proc = cli.train(read_only_dir / "s3r-run")
  assert_one_line_error(proc, 2, "--out", "is not writable")


def test_resuming_with_another_recipe_or_preset_is_refused_and_changes_nothing(cli, run_copy):
  """In this process (the refusal comes before any compile); test_resume.py runs the --recipe case as a subprocess."""
  before = snapshot(run_copy)
  for flag, value in (("--recipe", "int8_sr"), ("--preset", "cpu-small")):
    proc = cli("train", "--out", run_copy, "--resume", flag, value, in_process=True)
    assert_one_line_error(proc, 2, "--resume with a different configuration", f"{flag}: ")
  assert snapshot(run_copy) == before


@pytest.mark.slow
def test_a_50_mb_single_line_document_trains_in_bounded_memory(cli, tmp_path):
  import random
  import resource

  data = tmp_path / "data"
  data.mkdir()
  shutil_corpus = (cli.corpus / "docs.txt").read_text()
  (data / "small.txt").write_text(shutil_corpus)
  rng = random.Random(0)
  words = "alpha beta gamma delta epsilon zeta eta theta".split()
  (data / "huge.txt").write_text(" ".join(rng.choice(words) for _ in range(50_000_000 // 6)))
  proc = cli(
    *cli.train_args(tmp_path / "run", data=data)[:-4],
    "--cache-dir",
    tmp_path / "cache",
    "--out",
    tmp_path / "run",
    "--steps",
    "2",
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
  assert peak_gib < 2.5, f"peak memory {peak_gib:.1f} GiB"
