"""Reading corpora: formats, file selection, and one-line DataErrors."""

from __future__ import annotations

import gzip
import pathlib

import pytest

from s3r.data import DataError, default_data_root, read_documents, sources


def test_reads_txt_jsonl_jsonl_gz_json_gz_and_directories(tmp_path, write_jsonl):
  d = tmp_path / "corpus"
  (d / "sub").mkdir(parents=True)
  (d / "a.txt").write_text("first text doc\n\n\n\nsecond text doc\n")
  write_jsonl(d / "b.jsonl", [{"text": "jsonl doc"}])
  write_jsonl(d / "c.jsonl.gz", [{"text": "jsonl.gz doc", "url": "x"}])
  write_jsonl(d / "sub" / "d.json.gz", [{"text": "json.gz doc"}, {"text": "json.gz doc 2"}])
  (d / "e.py").write_text("print('py doc')\n")
  (d / "ignored.md").write_text("not a supported file")
  (d / ".hidden.txt").write_text("hidden files are skipped")
  expected = [
    "first text doc",
    "second text doc",
    "jsonl doc",
    "jsonl.gz doc",
    "print('py doc')\n",
    "json.gz doc",
    "json.gz doc 2",
  ]
  assert list(read_documents(str(d))) == expected
  # Each file on its own gives the same documents.
  assert list(read_documents(d / "sub" / "d.json.gz")) == ["json.gz doc", "json.gz doc 2"]
  assert list(read_documents(str(d / "c.jsonl.gz"))) == ["jsonl.gz doc"]


def test_txt_splits_documents_on_two_or_more_blank_lines(tmp_path):
  f = tmp_path / "t.txt"
  f.write_text("para one\n\npara two\n\n\nsecond doc\r\n \r\n\t\r\nthird doc\n\n\n\n\n")
  assert list(read_documents(f)) == ["para one\n\npara two", "second doc", "third doc"]


def test_glob_selects_matching_supported_files_in_sorted_order(tmp_path):
  for name in ("b.txt", "a.txt", "c.md"):
    (tmp_path / name).write_text(f"doc {name}")
  assert list(read_documents(str(tmp_path / "*"))) == ["doc a.txt", "doc b.txt"]


def test_prefix_and_gold_completion_count_as_text(tmp_path, write_jsonl):
  f = write_jsonl(tmp_path / "s.jsonl.gz", [{"prefix": "Hello, ", "gold_completion": "world."}])
  assert list(read_documents(f)) == ["Hello, world."]


def test_whitespace_only_documents_are_skipped(tmp_path, write_jsonl):
  f = write_jsonl(tmp_path / "w.jsonl", [{"text": " \n "}, {"text": "kept"}, {"text": ""}])
  assert list(read_documents(f)) == ["kept"]


def test_missing_path_raises_data_error(tmp_path):
  missing = tmp_path / "nope" / "corpus.jsonl"
  with pytest.raises(DataError, match="does not exist") as e:
    read_documents(str(missing))  # raised at the call, before iterating
  assert str(missing) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("pattern", ["dir", "glob"])
def test_directory_or_glob_without_supported_files_raises_data_error(tmp_path, pattern):
  (tmp_path / "notes.md").write_text("x")
  path = tmp_path if pattern == "dir" else tmp_path / "*.jsonl"
  with pytest.raises(DataError, match="no supported files"):
    read_documents(path)


def test_unsupported_single_file_raises_data_error(tmp_path):
  (tmp_path / "data.csv").write_text("a,b")
  with pytest.raises(DataError, match="unsupported file type"):
    read_documents(tmp_path / "data.csv")


def test_empty_corpus_raises_data_error(tmp_path, write_jsonl):
  (tmp_path / "a.txt").write_text("\n\n  \n")
  write_jsonl(tmp_path / "b.jsonl", [{"text": ""}])
  with pytest.raises(DataError, match="empty") as e:
    list(read_documents(tmp_path))
  assert "\n" not in str(e.value)


def test_jsonl_without_text_field_names_file_and_line(tmp_path, write_jsonl):
  f = write_jsonl(tmp_path / "c4.json.gz", [{"text": "ok"}, {"text": "ok"}, {"body": "no text"}])
  with pytest.raises(DataError) as e:
    list(read_documents(f))
  msg = str(e.value)
  assert f"{f}:3:" in msg and '"text"' in msg and "body" in msg and "\n" not in msg


def test_bad_json_names_file_and_line(tmp_path):
  f = tmp_path / "bad.jsonl"
  f.write_text('{"text": "ok"}\n\n{"text": "unterminated\n')
  with pytest.raises(DataError, match=rf"{f.name}:3: invalid JSON"):
    list(read_documents(f))


def test_corrupt_gzip_raises_data_error(tmp_path):
  f = tmp_path / "broken.jsonl.gz"
  f.write_bytes(gzip.compress(b'{"text": "x"}\n')[:-12])
  with pytest.raises(DataError, match="cannot read"):
    list(read_documents(f))


def test_data_root_comes_from_environment_variable(tmp_path, monkeypatch):
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path))
  assert default_data_root() == tmp_path.resolve()
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "missing"))
  with pytest.raises(DataError, match=sources.DATA_DIR_ENV):
    default_data_root()


def test_data_root_is_the_source_checkouts_sibling_not_a_folder_above_the_current_directory(tmp_path, monkeypatch):
  monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
  repo = tmp_path / "checkout" / "repo"
  monkeypatch.setattr(sources, "__file__", str(repo / "s3r" / "data" / "sources.py"))
  (tmp_path / "elsewhere" / "shared" / "data").mkdir(parents=True)
  (tmp_path / "elsewhere" / "deep").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere" / "deep")
  root, how = sources.locate_data_root()
  assert root is None and sources.DATA_DIR_ENV in how  # a shared/data above the cwd is not used
  (tmp_path / "checkout" / "shared" / "data").mkdir(parents=True)
  root, how = sources.locate_data_root()
  assert root is None  # without pyproject.toml above s3r/ this is an installed package: no sibling folder
  repo.mkdir(parents=True)
  (repo / "pyproject.toml").write_text("")
  root, how = sources.locate_data_root()
  assert root == tmp_path / "checkout" / "shared" / "data" and "beside the repository" in how
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "elsewhere"))
  assert sources.locate_data_root()[0] == (tmp_path / "elsewhere").resolve()  # the variable comes first


def test_no_module_names_a_machine_path():
  import s3r.data

  package = pathlib.Path(s3r.data.__file__).parent
  machine_prefix = str(package.parents[2])  # the folder that holds this checkout, on this machine
  if machine_prefix == package.anchor:
    pytest.skip("the checkout sits at the file-system root: no machine prefix to look for")
  for f in package.glob("*.py"):
    assert machine_prefix not in f.read_text(), f.name


def test_stdlib_files_exclude_tests_and_site_packages():
  files = sources.stdlib_python_files()
  rel = [f.relative_to(sources.stdlib_root()).parts for f in files]
  assert len(files) > 100 and all(p[-1].endswith(".py") for p in rel)
  assert not any({"test", "tests", "site-packages"} & set(p[:-1]) for p in rel)
  assert files == sorted(files, key=lambda f: f.relative_to(sources.stdlib_root()).as_posix())


def test_real_c4_snippets_are_read_as_prefix_plus_completion(real_data_root):
  path = real_data_root / "c4" / "c4-snippets-b.jsonl.gz"
  if not path.is_file():
    pytest.skip(f"{path} not found")
  docs = list(read_documents(path))
  assert len(docs) == 1480 and all(d.strip() for d in docs)
