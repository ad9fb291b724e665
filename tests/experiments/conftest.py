"""A small real-text corpus for end-to-end experiment tests."""

import pathlib

import pytest

from tests.train.conftest import write_corpus


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> pathlib.Path:
  return write_corpus(tmp_path_factory.mktemp("corpus"))
