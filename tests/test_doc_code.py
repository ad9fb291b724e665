"""What the docs say about the code's structure, checked against the code itself, so that a move of
code that makes a doc wrong fails here (and whoever moves updates the doc):

- docs/architecture.md's table of packages equals, both ways, the rule of tests/test_architecture.py
  and the import graph it computes from the source;
- every doc that lists the kinds of number grid (`s3r/quant/formats.py`) lists all of them and no other;
- every `s3r.…` name that docs/training-step.md gives imports.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tests import test_architecture as arch

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
_TICKED = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def architecture_table(text: str) -> dict[str, dict[str, object]]:
  """package -> {"imports", "may import": sets of package names; "only": the third-party packages it is
  limited to, or None} from the table under `## The rule`. Package names as tests/test_architecture.py
  has them (`quant` for `s3r.quant`, `s3r` for the top-level package); "the library" is every package of s3r/."""
  section = text.split("## The rule\n", 1)[1].split("\n## ", 1)[0]
  rows = [_cells(line) for line in section.splitlines() if line.startswith("|")]
  assert rows and rows[0] == ["package", "imports", "may import", "third party"], rows[:1]

  def names(cell: str) -> set[str]:
    out = set(arch.LIBRARY) if "the library" in cell else set()
    return out | {n.removeprefix("s3r.") for n in _TICKED.findall(cell)}

  table: dict[str, dict[str, object]] = {}
  for row in rows[2:]:
    assert len(row) == 4, row
    (package,) = _TICKED.findall(row[0])
    name = package.removeprefix("s3r.")
    assert name not in table, f"two rows for {package}"
    only = set(_TICKED.findall(row[3])) if row[3].endswith(" only") else None
    table[name] = {"imports": names(row[1]), "may import": names(row[2]), "only": only}
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
  graph, _ = arch._graph()
  wrong = [
    f"{pkg}: the table says {sorted(row['imports'])}, the code imports {sorted(graph.get(pkg, set()))}"
    for pkg, row in sorted(table.items())
    if row["imports"] != graph.get(pkg, set())
  ]
  assert not wrong, "docs/architecture.md's table against the imports of the source:\n" + "\n".join(wrong)


def test_architecture_table_rule_is_the_rule_the_layering_test_enforces():
  table = architecture_table(ARCHITECTURE.read_text())
  wrong = [
    f"{pkg}: the table allows {sorted(row['may import'])}, tests/test_architecture.py {sorted(arch.ALLOWED[pkg])}"
    for pkg, row in sorted(table.items())
    if pkg in arch.ALLOWED and row["may import"] != arch.ALLOWED[pkg]
  ]
  wrong += [
    f"{pkg}: third party limited to {row['only']} in the table, to {arch.THIRD_PARTY_ONLY.get(pkg)} in the test"
    for pkg, row in sorted(table.items())
    if row["only"] != arch.THIRD_PARTY_ONLY.get(pkg)
  ]
  assert not wrong, "\n".join(wrong)


def test_a_table_row_that_claims_an_import_the_code_lacks_is_caught():
  text = ARCHITECTURE.read_text()
  row = next(line for line in text.splitlines() if line.startswith("| `benchmarks` |"))
  bad = row.replace("`labtools` |", "`labtools`, `research` |", 1)
  assert bad != row
  table = architecture_table(text.replace(row, bad))
  graph, _ = arch._graph()
  assert table["benchmarks"]["imports"] - graph["benchmarks"] == {"research"}
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
