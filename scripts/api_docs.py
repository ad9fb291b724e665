"""The API reference of the library, generated from its docstrings with pdoc (the extra `s3r[docs]`).

    python scripts/api_docs.py [OUT]      # `make docs`: OUT defaults to build/docs (open OUT/index.html)

Every module of `s3r/` gets a page (a package with `__all__` shows those names; a module without
one, its public names). The build fails, with every message, when a module does not import or pdoc
warns about one (a broken cross-reference, an unreadable signature): the reference either builds
whole or not at all. `tests/test_doc_api.py` runs it.
"""

from __future__ import annotations

import pathlib
import sys
import warnings

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "build" / "docs"
# The packages whose names (`__all__`, else what the `__init__` imports) are the library's API; every one
# has a docstring (tests/test_doc_api.py).
PUBLIC = ("s3r", "s3r.quant", "s3r.nn", "s3r.model", "s3r.model.hf", "s3r.data", "s3r.train")
# The other packages of s3r/, with what they are for: documented in the reference too, but no API of their own.
INTERNAL = {
  "cli": "the `s3r` command (its API is the command line: `s3r --help`, docs/training.md)",
  "integrations": "backends for other frameworks, used through their configuration (docs/maxtext.md)",
}


def modules(root: pathlib.Path = REPO) -> list[str]:
  """The dotted name of every module of the library, packages first (from the source tree, so a new
  module is in the reference without a list to update); `__main__` modules are entry points, not API."""
  names = []
  for path in sorted((root / "s3r").rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__main__":
      continue
    names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
  return sorted(names, key=lambda n: (n.split("."), n))


def build(out: pathlib.Path, names: list[str] | None = None) -> list[str]:
  """Writes the reference of `names` (by default every module) under `out`; returns the pages written.

  Raises RuntimeError, naming each problem, when a module does not import or pdoc cannot document it.
  pdoc's notes on annotations it cannot evaluate (a PEP 695 type parameter, a name imported only for type
  checking) are not problems: the page shows the annotation as written.
  """
  import pdoc.doc
  import pdoc.render

  pdoc.render.configure(docformat="google", footer_text="s3r API reference", show_source=False)
  names = modules() if names is None else names
  problems: list[str] = []
  pages: dict[str, pdoc.doc.Module] = {}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name in names:
      try:
        pages[name] = pdoc.doc.Module.from_name(name)
      except Exception as e:  # noqa: BLE001 (every failure is reported, with its module)
        problems.append(f"{name}: {type(e).__name__}: {e}")
    for module in pages.values():
      path = out / f"{module.fullname.replace('.', '/')}.html"
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(pdoc.render.html_module(module, pages))
    (out / "index.html").write_text(pdoc.render.html_index(pages))
    (out / "search.js").write_text(pdoc.render.search_index(pages))
  problems += [str(w.message).splitlines()[0] for w in caught if _problem(w)]
  if problems:
    raise RuntimeError(f"the API reference has {len(problems)} problem(s):\n" + "\n".join(problems))
  return [str(p.relative_to(out)) for p in sorted(out.rglob("*.html"))]


def _problem(w: warnings.WarningMessage) -> bool:
  """A warning of pdoc's about the documented code, other than an annotation it cannot evaluate."""
  return "pdoc" in pathlib.Path(w.filename).parts and not str(w.message).startswith("Error parsing type annotation")


def main(argv: list[str]) -> int:
  out = pathlib.Path(argv[0]) if argv else DEFAULT_OUT
  try:
    pages = build(out)
  except ImportError:
    print("error: the API reference needs pdoc: pip install -c constraints.txt -e '.[docs]'", file=sys.stderr)
    return 2
  except RuntimeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"{len(pages)} pages in {out} (open {out / 'index.html'})")
  return 0


if __name__ == "__main__":
  sys.path.insert(0, str(REPO))  # the checkout's s3r, also without an editable install
  sys.exit(main(sys.argv[1:]))
