"""Data pipeline: corpora -> byte-level BPE tokenizer -> packed token batches.

Typical use::

    corpus = prepare(None)                      # enwiki if present, else the Python stdlib
    loader = BatchLoader(corpus.train_tokens, batch_size=32, seq_len=256, seed=0)
    batch = loader.next()                       # int32 [32, 257]: inputs [:, :-1], targets [:, 1:]
    for b in eval_batches(corpus.val_tokens["val"], batch_size=32, seq_len=256, max_batches=20):
        ...

Modules: :mod:`~s3r.data.sources` (finding and reading documents),
:mod:`~s3r.data.tokenizer` (the BPE tokenizer), :mod:`~s3r.data.cache`
(content-hash caching), :mod:`~s3r.data.corpus` (``prepare``),
:mod:`~s3r.data.loader` (batching), :mod:`~s3r.data.arrow` (Parquet files and
Hugging Face datasets folders, with pyarrow), :mod:`~s3r.data.stream` (the splits of a
corpus on disk, read from its files on every pass).
"""

from s3r.data.corpus import Corpus, prepare, split_documents
from s3r.data.errors import DataError
from s3r.data.loader import BatchLoader, eval_batches
from s3r.data.sources import default_data_root, read_documents
from s3r.data.tokenizer import EOT, Tokenizer

__all__ = [
  "BatchLoader",
  "Corpus",
  "DataError",
  "EOT",
  "Tokenizer",
  "default_data_root",
  "eval_batches",
  "prepare",
  "read_documents",
  "split_documents",
]
