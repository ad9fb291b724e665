"""Columnar corpora: Parquet files and folders written by Hugging Face ``datasets`` (``save_to_disk``).

Both are read with pyarrow alone (the optional extra ``s3r[parquet]``) in pieces, so a file is never held in
memory whole: a Parquet file in record batches of at most ``BATCH_ROWS`` rows (read from a row group or
two at a time, its unit of storage), an Arrow file of a ``save_to_disk`` folder record batch by record batch
(memory-mapped).
Each row's text column (``text`` unless ``--text-column`` names another) is one document; null and
whitespace-only values are skipped, as everywhere.

A ``save_to_disk`` folder of one dataset holds ``state.json`` (its Arrow files, in order, under
``_data_files``), ``dataset_info.json`` and the Arrow files (IPC streams); a folder of several splits
(``DatasetDict``) holds ``dataset_dict.json`` and one such folder per split, of which the ``train`` split is
read (name a split's folder to read another).

A missing column, a column that does not hold text, or a file pyarrow cannot read is a :class:`DataError`
naming the file and the column.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

from s3r.data.errors import DataError

DEFAULT_TEXT_COLUMN = "text"
BATCH_ROWS = 256  # rows per record batch read from a Parquet file (their texts are in memory at once)
DATASET_STATE = "state.json"  # a `datasets.Dataset.save_to_disk` folder
DATASET_DICT = "dataset_dict.json"  # a `datasets.DatasetDict.save_to_disk` folder
PARQUET_SUFFIX = ".parquet"
ARROW_SUFFIX = ".arrow"


def _pyarrow():
  try:
    import pyarrow
    import pyarrow.ipc
    import pyarrow.parquet
  except ImportError:
    raise DataError(
      "reading Parquet files and Hugging Face datasets folders needs pyarrow: pip install 's3r[parquet]'"
    ) from None
  return pyarrow


def is_dataset_folder(path: pathlib.Path) -> bool:
  """True for a folder written by ``datasets``' ``save_to_disk`` (a dataset, or a dict of splits)."""
  return path.is_dir() and ((path / DATASET_STATE).is_file() or (path / DATASET_DICT).is_file())


def dataset_files(folder: pathlib.Path) -> list[pathlib.Path]:
  """The Arrow files of a ``save_to_disk`` folder in their order (of its ``train`` split for a dict of splits)."""
  if (folder / DATASET_DICT).is_file() and not (folder / DATASET_STATE).is_file():
    splits = _json(folder / DATASET_DICT).get("splits", [])
    if "train" not in splits:
      raise DataError(
        f"{folder}: a datasets folder with the splits {', '.join(map(str, splits)) or 'none'} and no train split; "
        f"name the split's folder as --data (e.g. {folder / str(splits[0]) if splits else folder})"
      )
    folder = folder / "train"
  state = _json(folder / DATASET_STATE)
  names = [entry.get("filename") for entry in state.get("_data_files", []) if isinstance(entry, dict)]
  files = [folder / n for n in names if isinstance(n, str)]
  if not files or len(files) != len(names):
    raise DataError(f"{folder / DATASET_STATE}: lists no data files (_data_files)")
  if missing := [f for f in files if not f.is_file()]:
    raise DataError(f"{folder}: the data file {missing[0].name} that {DATASET_STATE} lists is missing")
  return files


def _json(path: pathlib.Path) -> dict:
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise DataError(f"cannot read {path}: {e}") from None
  if not isinstance(data, dict):
    raise DataError(f"{path}: expected a JSON object")
  return data


def read_columnar_documents(path: pathlib.Path, text_column: str | None = None) -> Iterator[str]:
  """The texts of ``text_column`` (default ``text``) of a Parquet or Arrow file, one record batch at a time."""
  pa = _pyarrow()
  column = text_column or DEFAULT_TEXT_COLUMN
  try:
    if path.name.lower().endswith(PARQUET_SUFFIX):
      reader = pa.parquet.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)  # no whole-file read-ahead
      _check_column(path, reader.schema_arrow, column)
      batches = reader.iter_batches(batch_size=BATCH_ROWS, columns=[column])
    else:
      schema, all_columns = _arrow_batches(pa, path)
      _check_column(path, schema, column)
      batches = (batch.select([column]) for batch in all_columns)
    for batch in batches:
      for text in batch.column(0).to_pylist():
        if text is not None and text and not text.isspace():
          yield text
  except (pa.ArrowException, OSError) as e:
    raise DataError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _arrow_batches(pa, path: pathlib.Path):
  """(schema, record batches) of an Arrow IPC stream (what ``datasets`` writes), else of an Arrow IPC file;
  memory-mapped, so a batch is read when it is reached."""
  try:
    stream = pa.ipc.open_stream(pa.memory_map(str(path)))
    return stream.schema, iter(stream)
  except pa.ArrowInvalid:
    file = pa.ipc.open_file(pa.memory_map(str(path)))
    return file.schema, (file.get_batch(i) for i in range(file.num_record_batches))


def _check_column(path: pathlib.Path, schema, column: str) -> None:
  import pyarrow as pa

  if column not in schema.names:
    names = ", ".join(schema.names) or "none"
    raise DataError(f"{path}: no column {column!r} (columns: {names}); name the text column with --text-column")
  kind = schema.field(column).type
  text_types = (pa.types.is_string, pa.types.is_large_string, getattr(pa.types, "is_string_view", lambda _: False))
  if not any(is_text(kind) for is_text in text_types):
    raise DataError(f"{path}: column {column!r} holds {kind}, not text; name the text column with --text-column")
