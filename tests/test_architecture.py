"""The package layering of docs/architecture.md, checked on every import of every module of the
library (`s3r/`) and of the tooling beside it (`benchmarks/`, `research/`, and `labtools/`, which both share).

Imports are read with `ast` (module level and inside functions alike). A library module's package
is its first component under `s3r` (`s3r/train/loop.py` is the package `train`, `s3r/__init__.py`
is `s3r`); every module of `benchmarks/`, `research/` or `labtools/` belongs to that one package,
except `labtools/analysis/` (program analysis), a package of its own: a leaf that imports nothing of s3r.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TOOLING = ("benchmarks", "research", "labtools")  # repository-only: they import the library, never the reverse
SCIENCE = {"jax", "jaxlib", "numpy"}  # the only third-party imports of the numerics core
LIBRARY = {"s3r", "quant", "nn", "model", "data", "train", "cli", "integrations"}
ANALYSIS = "labtools.analysis"  # jaxpr and HLO readers: the tests and benchmarks use them, the library does not

# package -> the packages it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
  "s3r": {"quant"},  # the top-level package re-exports the core
  "quant": set(),
  "nn": {"quant"},
  "model": {"quant", "nn"},
  "data": set(),
  "train": {"s3r", "quant", "nn", "model", "data"},
  "cli": {"s3r", "quant", "nn", "model", "data", "train"},
  "integrations": {"quant", "nn"},  # backends for other frameworks (MaxText), which they import lazily
  ANALYSIS: set(),
  "labtools": LIBRARY | {ANALYSIS},  # results files with provenance, the paper's numbers: shared by the two below
  "research": LIBRARY | {"labtools", ANALYSIS},
  "benchmarks": LIBRARY | {"labtools", ANALYSIS},  # never research: measuring the library needs none of the experiments
}
THIRD_PARTY_ONLY = {"quant": SCIENCE, ANALYSIS: SCIENCE}  # packages limited to these (and the stdlib)


def _package(path: pathlib.Path) -> str:
  rel = path.relative_to(REPO)
  if rel.parts[:2] == tuple(ANALYSIS.split(".")):
    return ANALYSIS
  if rel.parts[0] in TOOLING:
    return rel.parts[0]
  return "s3r" if rel.parts == ("s3r", "__init__.py") else rel.parts[1].removesuffix(".py")


def _imports(path: pathlib.Path, names: bool = False) -> list[tuple[int, str]]:
  """(line, absolute dotted name) of every import in the module, relative ones resolved; with `names`,
  `from a import b` gives "a.b" (the module a.b, or the name b of module a) whatever a is.

  A string constant "s3r.module:function" counts as an import of that module (the CLI imports its
  sub-commands by such names).
  """
  tree = ast.parse(path.read_text(), filename=str(path))
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        pkg = parts[: len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
        base = ".".join([*pkg, base] if base else pkg)
      full = names or base in ("s3r", "labtools")
      out += [(node.lineno, f"{base}.{a.name}" if full else base) for a in node.names]
    elif (
      isinstance(node, ast.Constant)
      and isinstance(node.value, str)
      and re.fullmatch(r"(s3r|benchmarks|research|labtools)(\.\w+)+:\w+", node.value)
    ):
      out.append((node.lineno, node.value.split(":")[0]))  # "module:function", imported on demand (cli.COMMANDS)
  return out


def _target(name: str) -> str | None:
  """The package an import refers to; None for a third-party or standard-library import."""
  parts = name.split(".")
  if parts[:2] == ANALYSIS.split("."):
    return ANALYSIS
  if parts[0] in TOOLING:
    return parts[0]
  if parts[0] != "s3r":
    return None
  if len(parts) == 1:
    return "s3r"
  sub = parts[1]
  return sub if sub in ALLOWED else "s3r"  # `from s3r import qmatmul` is the top-level re-export


def _graph() -> tuple[dict[str, set[str]], list[str]]:
  """Package -> packages imported, and every import that breaks the rule."""
  graph: dict[str, set[str]] = {}
  broken = []
  modules = sorted(p for top in ("s3r", *TOOLING) if (REPO / top).is_dir() for p in (REPO / top).rglob("*.py"))
  assert modules, f"no modules under {REPO}"
  for path in modules:
    pkg = _package(path)
    assert pkg in ALLOWED, f"{path.relative_to(REPO)}: package {pkg!r} has no rule in docs/architecture.md"
    for line, name in _imports(path):
      where = f"{path.relative_to(REPO)}:{line}"
      target = _target(name)
      if target is None:
        top = name.split(".")[0]
        allowed = THIRD_PARTY_ONLY.get(pkg)
        if allowed is not None and top not in allowed and top not in sys.stdlib_module_names:
          broken.append(f"{where}: {pkg} imports {name} (only {', '.join(sorted(allowed))} and the stdlib)")
        continue
      if target != pkg:
        graph.setdefault(pkg, set()).add(target)
        if target not in ALLOWED[pkg]:
          broken.append(f"{where}: {pkg} imports {name}")
  return graph, broken


def _module_graph() -> dict[str, set[str]]:
  """Module -> the modules of the library and the tooling it imports (a package is its `__init__`).
  An import names the longest module its dotted name starts with: `from s3r.model import stack` the
  module s3r.model.stack, `from s3r.model import ModelConfig` the package s3r.model."""
  modules = {}
  for top in ("s3r", *TOOLING):
    for path in (REPO / top).rglob("*.py") if (REPO / top).is_dir() else ():
      parts = path.relative_to(REPO).with_suffix("").parts
      modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

  def module(name: str) -> str | None:
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph: dict[str, set[str]] = {}
  for name, path in sorted(modules.items()):
    targets = {module(imported) for _, imported in _imports(path, names=True)}
    graph[name] = {t for t in targets if t is not None and t != name}
  return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of a graph (of packages, or of modules) as a path, or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done

  def visit(node: str, path: list[str]) -> list[str] | None:
    state[node] = 1
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return [*path[path.index(nxt) :], nxt] if nxt in path else [*path, nxt]
      if nxt not in state and (found := visit(nxt, [*path, nxt])):
        return found
    state[node] = 2
    return None

  for start in sorted(graph):
    if start not in state and (found := visit(start, [start])):
      return found
  return None


def test_every_import_follows_the_layering():
  _, broken = _graph()
  assert not broken, "imports that break docs/architecture.md:\n" + "\n".join(broken)


def test_the_library_imports_no_tooling_and_the_benchmarks_no_research():
  """The actual graph, not only the table: no library package reaches `benchmarks`, `research` or
  `labtools`, and `benchmarks` reaches `research` neither directly nor through `labtools`."""
  graph, _ = _graph()

  def reach(pkg: str) -> set[str]:
    seen, todo = set(), [pkg]
    while todo:
      for nxt in graph.get(todo.pop(), ()):
        if nxt not in seen:
          seen.add(nxt)
          todo.append(nxt)
    return seen

  assert {"benchmarks", "research", "labtools"} <= set(ALLOWED) and graph.get("benchmarks"), graph
  for pkg in sorted(LIBRARY):
    assert not reach(pkg) & {*TOOLING, ANALYSIS}, (pkg, reach(pkg))
  assert "research" not in reach("benchmarks") and "research" not in reach("labtools"), graph


def test_no_import_cycle_between_packages():
  graph, _ = _graph()
  cycle = _cycle(graph)
  assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_no_import_cycle_between_modules():
  """Module by module (imports inside functions included): no module imports, directly or through
  others, a module that imports it."""
  graph = _module_graph()
  assert "s3r.model.transformer" in graph["s3r.model"] and "labtools.analysis.hlo" in graph["labtools.analysis.memory"]
  cycle = _cycle(graph)
  assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_module_graph_finds_a_cycle_through_a_function_level_import(tmp_path, monkeypatch):
  pkg = tmp_path / "s3r" / "pkg"
  pkg.mkdir(parents=True)
  (tmp_path / "s3r" / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from s3r.pkg import leaf\ndef f():\n  from s3r.pkg import b\n")
  (pkg / "b.py").write_text("from s3r.pkg.a import f\n")
  (pkg / "leaf.py").write_text("")
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  graph = _module_graph()
  assert graph["s3r.pkg.a"] == {"s3r.pkg.leaf", "s3r.pkg.b"} and graph["s3r.pkg.b"] == {"s3r.pkg.a"}
  assert _cycle(graph) == ["s3r.pkg.a", "s3r.pkg.b", "s3r.pkg.a"]


@pytest.mark.parametrize(
  ("graph", "cycle"),
  [({"a": {"b"}, "b": {"c"}, "c": set()}, None), ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"])],
)
def test_cycle_finder_reports_a_cycle_and_only_a_cycle(graph, cycle):
  assert _cycle(graph) == cycle


def test_rule_checker_catches_an_upward_import(tmp_path, monkeypatch):
  pkg = tmp_path / "s3r"
  (pkg / "quant").mkdir(parents=True)
  (pkg / "quant" / "bad.py").write_text("def f():\n  from benchmarks import timing\n  import scipy\n")
  (pkg / "train").mkdir()
  (pkg / "train" / "bad.py").write_text("from labtools.results import log\n")
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  _, broken = _graph()
  assert [b.split(": ", 1)[1] for b in broken] == [
    "quant imports benchmarks",
    "quant imports scipy (only jax, jaxlib, numpy and the stdlib)",
    "train imports labtools.results",
  ]


MAX_MODULE_LINES = 450  # a module a reader holds in mind at once; past it, split by job
SIZED_ROOTS = ("s3r", "benchmarks", "labtools", "research", "scripts")


def _long_modules(roots: tuple[str, ...], limit: int = MAX_MODULE_LINES) -> list[str]:
  paths = (p for root in roots for p in sorted((REPO / root).rglob("*.py")))
  return [f"{p.relative_to(REPO)}: {n}" for p in paths if (n := len(p.read_text().splitlines())) > limit]


def test_no_module_is_over_450_lines():
  assert _long_modules(SIZED_ROOTS) == []


def test_module_length_check_names_a_long_module():
  assert _long_modules(("s3r",), limit=100)  # the library has modules over 100 lines: the check sees them
