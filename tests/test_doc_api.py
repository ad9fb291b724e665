"""The API reference (`make docs`, scripts/api_docs.py) and the docstrings it is made of.

Every public name has a docstring: the names in `__all__` of each public package (scripts/api_docs.py
`PUBLIC`; each has one). A module, class or function carries its
own; a constant carries the string literal right after its assignment (an attribute docstring, which pdoc
shows), found by following the re-exports to the module that assigns it. This check needs only the
standard library and runs in the default suite; the pdoc builds skip without the extra `s3r[docs]`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest

from scripts import api_docs

REPO = pathlib.Path(__file__).resolve().parents[1]


def public_names(package: str) -> list[str]:
  """The public API of a package: its `__all__` (which is also what its page in the reference shows)."""
  module = importlib.import_module(package)
  assert hasattr(module, "__all__"), f"{package} is public but has no __all__ (its reference page would be empty)"
  return list(module.__all__)


def _source(module: str) -> ast.Module:
  spec = importlib.util.find_spec(module)
  assert spec is not None and spec.origin, module
  return ast.parse(pathlib.Path(spec.origin).read_text())


def attribute_docstring(module: str, name: str, depth: int = 0) -> str | None:
  """The string literal after `name`'s assignment in the module that assigns it (following
  `from X import name` re-exports), or None."""
  body = _source(module).body
  for i, node in enumerate(body):
    if isinstance(node, ast.Assign | ast.AnnAssign):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
          return after.value.value
        return None
    if isinstance(node, ast.ImportFrom) and depth < 8:
      for alias in node.names:
        if (alias.asname or alias.name) == name:
          return attribute_docstring(_imported(module, node), alias.name, depth + 1)
  return None


def _imported(module: str, node: ast.ImportFrom) -> str:
  """The absolute name of the module `node` (in `module`) imports from."""
  if not node.level:
    return node.module or ""
  spec = importlib.util.find_spec(module)
  package = module if spec and spec.submodule_search_locations else module.rpartition(".")[0]
  return importlib.util.resolve_name("." * node.level + (node.module or ""), package)


def docstring(package: str, name: str) -> str | None:
  """The docstring that documents `package.name`, or None."""
  obj = getattr(importlib.import_module(package), name)
  if inspect.ismodule(obj):
    return obj.__doc__
  if inspect.isclass(obj):
    doc = vars(obj).get("__doc__")
    # dataclasses and NamedTuples write `Name(field, ...)` when the class has no docstring of its own
    return None if doc and re.fullmatch(rf"{re.escape(obj.__name__)}\(.*\)", doc.strip(), re.S) else doc
  if callable(obj):
    return getattr(obj, "__doc__", None)
  return attribute_docstring(package, name)


def test_every_package_of_the_library_is_public_or_named_internal():
  packages = {p.name for p in (REPO / "s3r").iterdir() if (p / "__init__.py").is_file()}
  top = {p.removeprefix("s3r.") for p in api_docs.PUBLIC if p.count(".") == 1}
  assert packages == top | set(api_docs.INTERNAL), (
    f"packages neither public nor internal in scripts/api_docs.py: {sorted(packages - top - set(api_docs.INTERNAL))}"
  )


def test_every_public_name_has_a_docstring():
  missing, checked = [], 0
  for package in api_docs.PUBLIC:
    for name in public_names(package):
      checked += 1
      if not (docstring(package, name) or "").strip():
        missing.append(f"{package}.{name}")
  assert checked > 80, checked
  assert not missing, "public names without a docstring:\n" + "\n".join(missing)


def test_every_module_of_the_library_has_a_docstring():
  modules = sorted((REPO / "s3r").rglob("*.py"))
  missing = [str(p.relative_to(REPO)) for p in modules if not ast.get_docstring(ast.parse(p.read_text()))]
  assert not missing, "modules without a docstring:\n" + "\n".join(missing)


def test_an_undocumented_constant_class_and_function_are_caught(tmp_path, monkeypatch):
  (tmp_path / "undocumented_pkg").mkdir()
  (tmp_path / "undocumented_pkg" / "__init__.py").write_text(
    "import dataclasses\nfrom undocumented_pkg.values import A, B\n__all__ = ['A', 'B', 'Point', 'f', 'g']\n"
    "@dataclasses.dataclass\nclass Point:\n  x: int\n"
    "def f():\n  pass\n"
    "def g():\n  '''Documented.'''\n"
  )
  values = 'A = 1\n"""A is one."""\nB = 2  # a comment is no docstring\n'
  (tmp_path / "undocumented_pkg" / "values.py").write_text(values)
  monkeypatch.syspath_prepend(str(tmp_path))
  assert public_names("undocumented_pkg") == ["A", "B", "Point", "f", "g"]
  documented = {n: bool(docstring("undocumented_pkg", n)) for n in public_names("undocumented_pkg")}
  assert documented == {"A": True, "B": False, "Point": False, "f": False, "g": True}


def test_the_public_packages_reference_builds_and_shows_every_public_name(tmp_path):
  pytest.importorskip("pdoc", reason="the API reference needs the extra s3r[docs] (pdoc)")
  modules = [  # a public name that is a module (`s3r.nn`) has its own page
    f"{p}.{n}"
    for p in api_docs.PUBLIC
    for n in public_names(p)
    if inspect.ismodule(getattr(importlib.import_module(p), n))
  ]
  pages = api_docs.build(tmp_path, [*api_docs.PUBLIC, *modules])
  assert set(pages) == {"index.html", *(f"{p.replace('.', '/')}.html" for p in [*api_docs.PUBLIC, *modules])}
  for package in api_docs.PUBLIC:
    html = (tmp_path / f"{package.replace('.', '/')}.html").read_text()
    module = importlib.import_module(package)
    shown = lambda n: f'/{n}.html"' in html if inspect.ismodule(getattr(module, n)) else f'id="{n}"' in html
    absent = [n for n in public_names(package) if not n.startswith("__") and not shown(n)]
    assert not absent, f"{package}: not in its page: {absent}"


def test_a_module_that_does_not_import_breaks_the_build(tmp_path, monkeypatch):
  pytest.importorskip("pdoc", reason="the API reference needs the extra s3r[docs] (pdoc)")
  (tmp_path / "broken_mod.py").write_text('"""A module whose import fails."""\nimport no_such_package_here\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(RuntimeError, match="broken_mod"):
    api_docs.build(tmp_path / "out", ["s3r.quant", "broken_mod"])


@pytest.mark.slow
def test_the_whole_api_reference_builds(tmp_path):
  pytest.importorskip("pdoc", reason="the API reference needs the extra s3r[docs] (pdoc)")
  pages = api_docs.build(tmp_path)
  assert len(pages) == len(api_docs.modules()) + 1  # one per module and the index
