"""What the docs say about the code's structure, checked against the code itself, so that a move of
code that makes a doc wrong fails here (and whoever moves updates the doc):

- docs/architecture.md's table of packages equals, both ways, the rule of tests/test_architecture.py
  and the import graph it computes from the source;
- every doc that lists the kinds of number grid (`s3r/quant/formats/`) lists all of them and no other;
- every `s3r.…` name that docs/training-step.md gives imports.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
from typing import NamedTuple

import pytest

from tests import test_architecture as arch

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
_TICKED = re.compile(r"`([^`]+)`")


@functools.cache
def _import_graph() -> dict[str, set[str]]:
  """Package -> the packages it imports, read from the source by tests/test_architecture.py (once per session)."""
  return arch._graph()[0]


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


class Row(NamedTuple):
  """One row of docs/architecture.md's table of packages."""

  imports: set[str]  # what the package imports (names as tests/test_architecture.py has them)
  may_import: set[str]  # what the rule allows it
  only: set[str] | None  # the third-party packages it is limited to, or None


def architecture_table(text: str) -> dict[str, Row]:
  """package -> its `Row`, from the table under `## The rule`. Package names as tests/test_architecture.py
  has them (`quant` for `s3r.quant`, `s3r` for the top-level package); "the library" is every package of s3r/."""
  section = text.split("## The rule\n", 1)[1].split("\n## ", 1)[0]
  rows = [_cells(line) for line in section.splitlines() if line.startswith("|")]
  assert rows and rows[0] == ["package", "imports", "may import", "third party"], rows[:1]

  def names(cell: str) -> set[str]:
    out = set(arch.LIBRARY) if "the library" in cell else set()
    return out | {n.removeprefix("s3r.") for n in _TICKED.findall(cell)}

  table: dict[str, Row] = {}
  for row in rows[2:]:
    assert len(row) == 4, row
    (package,) = _TICKED.findall(row[0])
    name = package.removeprefix("s3r.")
    assert name not in table, f"two rows for {package}"
    only = set(_TICKED.findall(row[3])) if row[3].endswith(" only") else None
    table[name] = Row(imports=names(row[1]), may_import=names(row[2]), only=only)
  return table


def test_architecture_table_has_one_row_per_package_and_only_those():
  table = architecture_table(ARCHITECTURE.read_text())
  assert set(table) == set(arch.ALLOWED), (
    f"rows without a package: {sorted(set(table) - set(arch.ALLOWED))}; "
    f"packages without a row: {sorted(set(arch.ALLOWED) - set(table))}"
  )


def test_architecture_table_imports_are_the_import_graph_both_ways():
  """A row names every package its package imports, and none that it does not import."""
  table = architecture_table(ARCHITECTURE.read_text())
  graph = _import_graph()
  wrong = [
    f"{pkg}: the table says {sorted(row.imports)}, the code imports {sorted(graph.get(pkg, set()))}"
    for pkg, row in sorted(table.items())
    if row.imports != graph.get(pkg, set())
  ]
  assert not wrong, "docs/architecture.md's table against the imports of the source:\n" + "\n".join(wrong)


def test_architecture_table_rule_is_the_rule_the_layering_test_enforces():
  table = architecture_table(ARCHITECTURE.read_text())
  wrong = [
    f"{pkg}: the table allows {sorted(row.may_import)}, tests/test_architecture.py {sorted(arch.ALLOWED[pkg])}"
    for pkg, row in sorted(table.items())
    if pkg in arch.ALLOWED and row.may_import != arch.ALLOWED[pkg]
  ]
  wrong += [
    f"{pkg}: third party limited to {row.only} in the table, to {arch.THIRD_PARTY_ONLY.get(pkg)} in the test"
    for pkg, row in sorted(table.items())
    if row.only != arch.THIRD_PARTY_ONLY.get(pkg)
  ]
  assert not wrong, "\n".join(wrong)


def test_a_table_row_that_claims_an_import_the_code_lacks_is_caught():
  text = ARCHITECTURE.read_text()
  row = next(line for line in text.splitlines() if line.startswith("| `benchmarks` |"))
  bad = row.replace("`labtools` |", "`labtools`, `research` |", 1)
  assert bad != row
  table = architecture_table(text.replace(row, bad))
  graph = _import_graph()
  assert table["benchmarks"].imports - graph["benchmarks"] == {"research"}
  with pytest.raises(AssertionError, match="two rows"):
    architecture_table(text.replace(row, row + "\n" + row))


# The kinds of grid: every doc paragraph that says "kind of grid" and names format classes or `grid ==` values.
GRID_DOCS = ["docs/architecture.md", "docs/extending.md", "docs/algorithm.md"]


def _grid_classes() -> dict[str, str]:
  """Concrete `Format` subclass name -> its `grid`, from the code."""
  from s3r.quant import formats

  found: dict[str, str] = {}
  todo = [formats.Format]
  while todo:
    cls = todo.pop()
    todo += cls.__subclasses__()
    if "grid" in vars(cls):
      found[cls.__name__] = cls.grid
  return found


def test_the_code_has_one_format_class_per_grid_kind():
  from s3r.quant.formats import GRIDS

  assert sorted(_grid_classes().values()) == sorted(GRIDS)


def grid_lists(text: str) -> list[tuple[str, set[str]]]:
  """(the paragraph's start, the set it names) for each paragraph about the kinds of grid: the concrete
  format classes it names (`...Format`, less the abstract `Format` and `BlockScaledFormat`), or the
  `grid == "..."` values it lists."""
  out = []
  for para in re.split(r"\n\s*\n", text):
    if "kind of grid" not in para:
      continue
    classes = set(re.findall(r"`(\w*Format)`", para)) - {"Format", "BlockScaledFormat"}
    grids = set(re.findall(r'"(\w+)"`?', para.split("grid ==", 1)[1])) if "`grid ==" in para else set()
    if len(classes) > 1:
      out.append((para.strip()[:60], classes))
    if grids:
      out.append((para.strip()[:60], grids))
  return out


def test_docs_name_every_kind_of_grid_and_no_other():
  classes = _grid_classes()
  wrong, seen = [], 0
  for doc in GRID_DOCS:
    for where, named in grid_lists((REPO / doc).read_text()):
      seen += 1
      expected = set(classes) if all(n.endswith("Format") for n in named) else set(classes.values())
      if named != expected:
        wrong.append(f"{doc} ({where}...): names {sorted(named)}, the code has {sorted(expected)}")
  assert seen >= 4, f"only {seen} lists of grid kinds found in {GRID_DOCS}"
  assert not wrong, "\n".join(wrong)


def test_a_doc_that_leaves_out_a_kind_of_grid_is_caught():
  text = (REPO / "docs" / "extending.md").read_text()
  assert "`BlockFloatFormat`, " in text and '`"block_float"`, ' in text
  short = text.replace("`BlockFloatFormat`, ", "").replace('`"block_float"`, ', "")
  assert [named for _, named in grid_lists(short)] == [
    {"UniformFormat", "E2M1Format", "FloatFormat"},
    {"uniform", "e2m1", "float"},
  ]


# docs/training-step.md: every `s3r.…` name it gives exists.
TRAINING_STEP = REPO / "docs" / "training-step.md"
_DOTTED = re.compile(r"`(s3r(?:\.\w+)+)")


def resolve(dotted: str) -> object:
  """The object `dotted` names: the longest importable module prefix, then attributes. Raises if absent."""
  import importlib

  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ModuleNotFoundError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ModuleNotFoundError(dotted)


def test_every_name_the_training_step_walk_gives_exists():
  names = sorted(set(_DOTTED.findall(TRAINING_STEP.read_text())))
  assert len(names) >= 40, names  # the walk names the functions of every stage
  missing = []
  for name in names:
    try:
      resolve(name)
    except (ImportError, AttributeError) as e:
      missing.append(f"{name}: {type(e).__name__}: {e}")
  assert not missing, "docs/training-step.md names what the code does not have:\n" + "\n".join(missing)


def test_a_name_that_does_not_exist_is_caught():
  assert resolve("s3r.quant.matmul.qmatmul") is resolve("s3r.quant.qmatmul")
  for name in ("s3r.quant.matmul.no_such_function", "s3r.no_such_package.f", "s3r.quant.Recipe.no_such_field"):
    with pytest.raises((ImportError, AttributeError)):
      resolve(name)


# Section references: `docs/page.md, "Heading"` in the docs and in the code's comments, and Markdown links
# `[text](page.md#anchor)`, point at a heading the page has (so a page split or a renamed heading fails here).
REFERRING = ("README.md", "docs/*.md", "research/**/*.md", "scripts/README.md", "scripts/*.sh", "scripts/*.py")
REFERRING += tuple(f"{top}/**/*.py" for top in ("s3r", "benchmarks", "research", "labtools"))
_SECTION_REF = re.compile(
  r"""(?<![\w/])((?:research/)?docs/[\w-]+\.md),\s*(?:#\s*)?(?P<q>["'])(?P<heading>[^"'`]{3,160}?)(?P=q)""", re.S
)
_ANCHOR_LINK = re.compile(r"\]\(([\w./-]*\.md)#([^)\s]+)\)")


def headings(page: pathlib.Path) -> list[str]:
  lines = re.sub(r"```.*?```", "", page.read_text(), flags=re.S).splitlines()
  return [line.lstrip("#").strip() for line in lines if re.match(r"#{1,6} ", line)]


def slug(heading: str) -> str:
  """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def section_references(text: str) -> list[tuple[str, str]]:
  """(page, heading) of each `docs/page.md, "Heading"` (or `research/docs/...`) in `text`; a heading may wrap
  over a comment's lines."""
  out = []
  for m in _SECTION_REF.finditer(text):
    out.append((m.group(1), " ".join(re.sub(r"\n\s*#?\s*", " ", m.group("heading")).split())))
  return out


def _referring_files() -> list[pathlib.Path]:
  return sorted({p for pattern in REFERRING for p in REPO.glob(pattern) if p.is_file()})


def test_every_section_a_doc_or_comment_refers_to_exists():
  wrong, seen = [], 0
  for path in _referring_files():
    text = path.read_text()
    for page, heading in section_references(text):
      seen += 1
      target = REPO / page
      if not target.is_file() or not any(h == heading or h.startswith(heading) for h in headings(target)):
        wrong.append(f'{path.relative_to(REPO)}: {page}, "{heading}"')
    if path.suffix == ".md":
      for link, anchor in _ANCHOR_LINK.findall(text):
        target = (path.parent / link).resolve()
        seen += 1
        if target.is_file() and anchor not in {slug(h) for h in headings(target)}:
          wrong.append(f"{path.relative_to(REPO)}: {link}#{anchor}")
  assert seen > 10, seen
  assert not wrong, "references to sections that do not exist:\n" + "\n".join(wrong)


def test_a_reference_to_a_moved_section_is_caught():
  text = 'see docs/performance.md, "Where the INT8\n  # compile time goes"'
  assert section_references(text) == [("docs/performance.md", "Where the INT8 compile time goes")]
  assert "Where the INT8 compile time goes" not in headings(REPO / "docs" / "performance.md")
  assert slug("Train step of `paper-12l` at 2 layers, H100 target: memory") == (
    "train-step-of-paper-12l-at-2-layers-h100-target-memory"
  )


# Committed results files, read as docs/performance.md and docs/results-files.md describe them.
RESULTS = ("results", "research/results")
CODE_SUFFIXES = (".py", ".sh")


def _run_metadata(node) -> list[dict]:
  """Every run's metadata in a results JSON (a merged file holds its parts'): dicts with a command and git."""
  if isinstance(node, dict):
    own = [node] if isinstance(node.get("command"), str) and isinstance(node.get("git"), dict) else []
    return own + [m for v in node.values() for m in _run_metadata(v)]
  if isinstance(node, list):
    return [m for v in node for m in _run_metadata(v)]
  return []


def _results_metadata() -> dict[str, list[dict]]:
  import json

  out = {}
  for top in RESULTS:
    for path in sorted((REPO / top).rglob("*.json")):
      try:
        metas = _run_metadata(json.loads(path.read_text()))
      except ValueError:  # not JSON (UnicodeDecodeError is a ValueError)
        continue
      if metas:
        out[str(path.relative_to(REPO))] = metas
  return out


def test_every_benchmark_results_file_measured_with_uncommitted_code_is_named_in_the_performance_overview():
  section = (REPO / "docs" / "performance.md").read_text().split("## Where the numbers come from\n", 1)[1]
  paragraph = section.strip("\n").split("\n\n", 1)[0]
  with_code = sorted(
    path
    for path, metas in _results_metadata().items()
    if path.startswith("results/")  # the benchmarks' files, which the performance pages quote
    and any(p.endswith(CODE_SUFFIXES) for m in metas for p in m["git"].get("dirty_paths") or [])
  )
  assert with_code, "no results file records uncommitted code: the paragraph can go"
  unnamed = [p for p in with_code if not any(f"`{n}`" in paragraph for n in _names(p))]
  assert not unnamed, f"docs/performance.md does not say these were measured with uncommitted code: {unnamed}"


def _names(path: str) -> list[str]:
  """How a doc may name a results file: its path, its stem with `.*`, or the subfolder of `results/` holding it."""
  p = pathlib.PurePosixPath(path)
  return [path, f"{p.with_suffix('')}.*"] + ([f"{p.parent}/"] if len(p.parts) > 2 else [])


def command_renames() -> list[tuple[re.Pattern, str]]:
  """(recorded form as a pattern, today's form) from docs/results-files.md's table; NAME is any name."""
  section = (REPO / "docs" / "results-files.md").read_text().split("## Commands as recorded\n", 1)[1]
  rows = [_cells(line) for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
  out = []
  for recorded, today in rows:
    (old,), (new,) = _TICKED.findall(recorded), _TICKED.findall(today)
    pattern = re.escape(old).replace("NAME", r"(?P<name>[\w-]+)")
    out.append((re.compile(rf"^(?:\S*/)?{pattern}(?=\s|$)"), new))
  return out


def current_command(command: str, renames: list[tuple[re.Pattern, str]]) -> str:
  for pattern, new in renames:
    m = pattern.match(command)
    if m:
      return new.replace("NAME", m.groupdict().get("name") or "") + command[m.end() :]
  return command


def command_exists(command: str) -> bool | None:
  """Whether today's repository has `command` (`python -m benchmarks|research ...`); None: not such a command."""
  words = command.split()
  if words[:2] != ["python", "-m"] or len(words) < 3:
    return None
  module = words[2]
  if module == "benchmarks":
    import benchmarks.cli

    return len(words) > 3 and words[3] in benchmarks.cli.COMMANDS
  if module == "research":
    tree = ast.parse((REPO / "research" / "__main__.py").read_text())
    assigns = [n for n in tree.body if isinstance(n, ast.Assign)]
    commands = next(ast.literal_eval(n.value) for n in assigns if ast.unparse(n.targets[0]) == "COMMANDS")
    return len(words) > 3 and words[3] in commands
  if module.startswith(("research.", "benchmarks.")):
    return (REPO / (module.replace(".", "/") + ".py")).is_file()
  return False


def test_every_recorded_command_runs_today_under_the_appendix_spelling():
  renames = command_renames()
  checked, wrong = 0, []
  for path, metas in _results_metadata().items():
    for meta in metas:
      command = current_command(meta["command"], renames)
      if command.split()[0] in ("README.md,", "scripts/device_smoke.py"):
        continue  # a documented snippet, a device script: not a command of the two packages
      checked += 1
      if not command_exists(command):
        wrong.append(f"{path}: {meta['command']!r} -> {command!r}")
  assert checked > 100, checked
  assert not wrong, "recorded commands that docs/results-files.md does not map to a command of today:\n" + "\n".join(
    sorted(set(wrong))
  )


def test_a_recorded_command_without_a_row_is_caught():
  renames = command_renames()
  assert current_command("cli.py bench ffn --shapes all", renames) == "python -m benchmarks ffn --shapes all"
  assert current_command("s3r diagnose runs/x", renames) == "python -m research diagnose runs/x"
  assert current_command("python -m experiments.dose --x", renames) == "python -m research.dose --x"
  assert command_exists(current_command("python -m s3r.experiments.mechanism", renames))
  assert not command_exists(current_command("s3r bench no_such_benchmark", renames))
  assert not command_exists(current_command("s3r profile-old --x", renames))
