"""Parquet files and Hugging Face `datasets` folders as corpora: the text column (or --text-column), globs, reading a
record batch at a time, the token cache keyed by the texts, and one-line errors for a missing, non-text or empty
column or file."""

from __future__ import annotations

import sys

import pytest

from s3r.data import DataError, prepare, read_documents
from s3r.data import arrow as s3r_arrow

pa = pytest.importorskip("pyarrow", reason="Parquet and datasets corpora need pyarrow (pip install 's3r[parquet]')")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(path, columns: dict, row_group_size: int | None = None):
  pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
  return path


def test_a_parquet_files_text_column_gives_one_document_per_row_in_order_skipping_nulls_and_blanks(tmp_path, make_docs):
  docs = make_docs(30)
  texts = [*docs[:10], None, "   ", *docs[10:]]
  path = _parquet(tmp_path / "c.parquet", {"text": texts, "id": list(range(len(texts)))}, row_group_size=7)
  assert pq.ParquetFile(path).num_row_groups == 5
  assert list(read_documents(path)) == docs


def test_text_column_names_another_column_of_parquet_and_the_field_of_json_lines(tmp_path, make_docs, write_jsonl):
  docs = make_docs(6)
  path = _parquet(tmp_path / "c.parquet", {"text": ["x"] * 6, "body": docs})
  assert list(read_documents(path, text_column="body")) == docs
  lines = write_jsonl(tmp_path / "c.jsonl", [{"body": d} for d in docs])
  assert list(read_documents(lines, text_column="body")) == docs


def test_a_glob_of_parquet_files_reads_them_in_name_order(tmp_path, make_docs):
  docs = make_docs(9)
  for i in range(3):
    _parquet(tmp_path / f"part-{i}.parquet", {"text": docs[3 * i : 3 * i + 3]})
  assert list(read_documents(str(tmp_path / "part-*.parquet"))) == docs


@pytest.mark.parametrize(
  "columns, text_column, message",
  [
    ({"body": ["a b c"]}, None, "no column 'text' (columns: body); name the text column with --text-column"),
    ({"text": ["a b c"]}, "body", "no column 'body' (columns: text)"),
    ({"text": [1, 2, 3]}, None, "column 'text' holds int64, not text; name the text column with --text-column"),
  ],
)
def test_a_missing_or_non_text_column_is_one_line_naming_file_and_column(tmp_path, columns, text_column, message):
  path = _parquet(tmp_path / "c.parquet", columns)
  with pytest.raises(DataError) as e:
    list(read_documents(path, text_column=text_column))
  assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_an_empty_parquet_file_or_one_without_rows_is_one_line(tmp_path):
  empty = tmp_path / "empty.parquet"
  empty.write_bytes(b"")
  with pytest.raises(DataError, match=r"cannot read .*empty\.parquet: ") as e:
    list(read_documents(empty))
  assert "\n" not in str(e.value)
  rowless = _parquet(tmp_path / "rows.parquet", {"text": pa.array([], pa.string())})
  with pytest.raises(DataError, match="is empty: no non-empty document"):
    list(read_documents(rowless))


def test_a_parquet_file_is_read_a_row_group_at_a_time(tmp_path, monkeypatch):
  """Arrow's memory while reading stays near one row group (1 MB), far below the column (4,000 rows of 4 KB)."""
  row = "word " * 800
  path = _parquet(tmp_path / "big.parquet", {"text": [f"{i} {row}" for i in range(4000)]}, row_group_size=250)
  monkeypatch.setattr(s3r_arrow, "BATCH_ROWS", 100)
  base, peak, n = pa.total_allocated_bytes(), 0, 0
  for _ in read_documents(path):
    n += 1
    peak = max(peak, pa.total_allocated_bytes() - base)
  column_bytes = 4000 * len(row)
  assert n == 4000 and peak < column_bytes / 4, (peak, column_bytes)


def test_a_datasets_save_to_disk_folder_is_read_with_pyarrow_in_its_order(tmp_path, make_docs):
  datasets = pytest.importorskip("datasets", reason="writing the folder needs Hugging Face datasets (a test tool)")
  docs = make_docs(12)
  folder = tmp_path / "ds"
  datasets.Dataset.from_dict({"text": docs, "label": list(range(12))}).save_to_disk(str(folder), num_shards=3)
  assert list(read_documents(folder)) == docs
  splits = datasets.DatasetDict(
    {"train": datasets.Dataset.from_dict({"content": docs[:8]}), "test": datasets.Dataset.from_dict({"content": docs})}
  )
  splits.save_to_disk(str(tmp_path / "dd"))
  assert list(read_documents(tmp_path / "dd", text_column="content")) == docs[:8]  # the train split
  assert list(read_documents(tmp_path / "dd" / "test", text_column="content")) == docs


def test_the_token_cache_key_changes_with_the_file_contents_and_with_the_column(tmp_path, make_docs, no_data_root, log):
  docs, other = make_docs(40), make_docs(40, prefix="other")
  path = _parquet(tmp_path / "c.parquet", {"text": docs, "body": other})
  cache = tmp_path / "cache"
  keys = lambda corpus: corpus.info["token_cache"]["train"]["cache_key"]
  first = prepare(str(path), vocab_size=300, cache_dir=cache, log=log)
  again = prepare(str(path), vocab_size=300, cache_dir=cache, log=log)
  assert keys(again) == keys(first) and again.info["token_cache"]["train"]["cached"]
  body = prepare(str(path), vocab_size=300, cache_dir=cache, text_column="body", log=log)
  assert keys(body) != keys(first) and body.info["text_column"] == "body"
  _parquet(path, {"text": [*docs[:-1], docs[-1] + " changed"], "body": other})
  changed = prepare(str(path), vocab_size=300, cache_dir=cache, log=log)
  every = lambda corpus: {k: v["cache_key"] for k, v in corpus.info["token_cache"].items()}
  assert every(changed) != every(first)  # the split that holds the changed document


def test_without_pyarrow_a_parquet_corpus_is_one_line_naming_the_extra(tmp_path, monkeypatch):
  path = _parquet(tmp_path / "c.parquet", {"text": ["a b"]})
  monkeypatch.setitem(sys.modules, "pyarrow", None)
  with pytest.raises(DataError, match=r"needs pyarrow: pip install 's3r\[parquet\]'"):
    list(read_documents(path))
