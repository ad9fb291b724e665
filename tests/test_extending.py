"""docs/extending.md names only files that exist (it lists what each kind of addition touches)."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_path_docs_extending_names_exists():
  text = (REPO / "docs" / "extending.md").read_text()
  named = {m for m in re.findall(r"`((?:s3r|tests|benchmarks|experiments|docs)/[\w/.]+\.(?:py|md))`", text)}
  named |= {"README.md"} if "`README.md`" in text else set()
  assert len(named) >= 15, sorted(named)
  missing = sorted(p for p in named if "<name>" not in p and not (REPO / p).exists())
  assert not missing, missing
