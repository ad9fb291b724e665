"""Every repository path that README.md, docs/*.md, research/ and scripts/README.md name in backticks exists,
and so does every Python name they point into with `file.py::name`.

A path is a backticked span whose first component is a top-level entry of the repository
(`s3r/quant/matmul.py`, `results/x.json`, `README.md`); a bare module name (`grouped.py::_bwd`)
is any module of the repository with that file name. Placeholders (`<name>`) and globs (`*`)
must match at least one file, `{a,b}` each of its alternatives and `[_<tag>]` with or without
its part; paths under `runs/` are outputs a command writes, not files of the repository.
"""

import itertools
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [
  REPO / "README.md",
  *sorted((REPO / "docs").glob("*.md")),
  *sorted((REPO / "research" / "docs").glob("*.md")),
  REPO / "research" / "README.md",
  REPO / "scripts" / "README.md",
]
OUTPUTS = "runs"  # where commands write by default: documented, never committed
PACKAGES = ("s3r", "benchmarks", "research", "labtools", "scripts", "tests")  # where a bare module name is looked up
_SPAN = re.compile(r"`([^`\s]+)`")
_SYMBOL = re.compile(r"^(.+\.py)::([\w.]+)$")


def _top_level() -> set[str]:
  return {p.name for p in REPO.iterdir() if not p.name.startswith(".")} | {OUTPUTS}


def named(text: str, tops: set[str]) -> set[tuple[str, str | None]]:
  """(path, Python name or None) of each repository path named in backticks in `text`; a bare
  module name (no folder) counts when it points at a name (`matmul.py::_dx`)."""
  out = set()
  for span in _SPAN.findall(text):
    path = re.sub(r":\d+$", "", span.strip("'\""))
    m = _SYMBOL.match(path)
    path, symbol = (m.group(1), m.group(2)) if m else (path, None)
    if path.split("/")[0] in tops or (symbol and "/" not in path):
      out.add((path, symbol))
  return out


def alternatives(path: str) -> list[str]:
  """`path` once per combination of its `{a,b}` alternatives."""
  parts = re.split(r"\{([^}]*)\}", path)  # literal, alternatives, literal, ...
  choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
  return ["".join(c) for c in itertools.product(*choices)]


def exists(path: str) -> bool:
  """Whether the repository has `path`: some variant matches for an optional part, every `{a,b}` alternative."""
  path = re.sub(r"<[^>]*>", "*", path.rstrip("/"))
  if "[" in path:
    return any(exists(re.sub(r"\[([^\]]*)\]", repl, path, count=1)) for repl in (r"\1", ""))
  return all(any(REPO.glob(p)) if "*" in p else (REPO / p).exists() for p in alternatives(path))


def defines(path: str, symbol: str) -> bool:
  """Whether the module `path` (or, for a bare file name, one of the repository's modules of that
  name) defines every part of the dotted `symbol` (a def, a class or an assignment)."""
  modules = [REPO / path] if "/" in path else [p for pkg in PACKAGES for p in (REPO / pkg).rglob(path)]
  parts = symbol.split(".")

  def has(src: str, name: str) -> bool:
    return bool(re.search(rf"^\s*((async\s+)?def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]", src, re.M))

  return any(m.is_file() and all(has(m.read_text(), n) for n in parts) for m in modules)


def test_every_repository_path_and_python_name_the_docs_name_exists():
  tops = _top_level()
  checked, missing = 0, []
  for doc in DOCS:
    for path, symbol in sorted(named(doc.read_text(), tops), key=str):
      if path.split("/")[0] == OUTPUTS:
        continue
      checked += 1
      found = defines(path, symbol) if symbol else exists(path)
      if not found:
        missing.append(f"{doc.relative_to(REPO)}: {path}" + (f"::{symbol}" if symbol else ""))
  assert checked >= 100, checked  # the spans are found at all
  assert not missing, "\n".join(missing)


def test_missing_paths_placeholders_without_a_match_and_undefined_names_are_reported():
  tops = _top_level()
  text = "`s3r/quant/matmul.py::qmatmul` `s3r/bench/step.py` `runs/x/` `docs/<none>.txt` `ec.py::_dx` `x = 1`"
  assert named(text, tops) == {
    ("s3r/quant/matmul.py", "qmatmul"),
    ("s3r/bench/step.py", None),
    ("runs/x/", None),
    ("docs/<none>.txt", None),
    ("ec.py", "_dx"),
  }
  assert exists("s3r/quant/matmul.py") and exists("benchmarks/<name>.py") and exists("docs/{algorithm,moe}.md")
  assert exists("results/bench_step[_<tag>]_<platform>.{json,md}")
  assert not exists("s3r/bench/step.py") and not exists("docs/<none>.txt") and not exists("docs/{algorithm,nope}.md")
  assert (
    defines("s3r/quant/matmul.py", "qmatmul")
    and defines("matmul.py", "_dx")
    and defines("matmul.py", "GlobalRows.index")
  )
  assert not defines("ec.py", "_dx") and not defines("s3r/quant/matmul.py", "_round")


def test_the_docs_index_links_every_doc():
  """docs/index.md maps every page under docs/ and research/docs/ (a new page must be added to it)."""
  index = (REPO / "docs" / "index.md").read_text()
  pages = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.name != "index.md"]
  pages += [f"../research/docs/{p.name}" for p in sorted((REPO / "research" / "docs").glob("*.md"))]
  missing = [p for p in pages if f"]({p})" not in index]
  assert not missing, f"docs/index.md does not link {missing}"


def test_every_relative_markdown_link_of_the_docs_resolves():
  """A link `[text](path)` or image `![alt](path)` in README.md, docs/ or research/docs/ points at a
  file that exists, relative to the page (an anchor after `#` is not checked; web links are skipped)."""
  broken = []
  for doc in DOCS:
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
      path = target.split("#", 1)[0]
      if path and not re.match(r"[a-z]+:", path) and not (doc.parent / path).exists():
        broken.append(f"{doc.relative_to(REPO)}: {target}")
  assert not broken, "\n".join(broken)
