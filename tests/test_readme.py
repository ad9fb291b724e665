"""The README stays true: its Python examples run and its recipe table names every recipe."""

import pathlib
import re

import s3r

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()


def _python_blocks():
  return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_core_api_example_runs():
  namespace = {}
  exec(compile(_python_blocks()[0], "README.md", "exec"), namespace)
  assert namespace["dx"].shape == (8, 256, 1024) and namespace["dw"].shape == (1024, 4096)


def test_readme_recipe_table_and_notes_name_every_recipe():
  for name in s3r.RECIPES:
    assert f"`{name}`" in README, name


def test_readme_test_command_is_the_one_ci_runs():
  """The README's test command is `make <target>` for the target .ci/run ends with, word for word."""
  ci = (pathlib.Path(__file__).parents[1] / ".ci" / "run").read_text()
  commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
  ci_target = re.fullmatch(r'make PYTHON="\$PY" (\S+)', commands[-1])
  assert ci_target, f".ci/run does not end with a make target: {commands[-1]}"
  match = re.search(r"^## Quickstart\n(.*?)(?=^## )", README, flags=re.S | re.M)
  assert match, "the README has no '## Quickstart' section"
  quickstart = match.group(1)
  readme = re.findall(r"^make (\S+)\s+#.*\(what CI runs\)$", quickstart, flags=re.M)
  assert readme == [ci_target.group(1)], (readme, ci_target.group(1))


def test_every_results_file_the_docs_name_is_committed():
  # A figure or table quoted in the README, docs/ or research/docs/ must exist (a renamed output would
  # leave a broken image link or an unverifiable number). Globs and brace lists are left out.
  root = pathlib.Path(__file__).parents[1]
  pages = [*sorted((root / "docs").rglob("*.md")), *sorted((root / "research" / "docs").rglob("*.md"))]
  texts = [README] + [p.read_text() for p in pages]
  pattern = r"(?<![\w./])(?:research/)?results/[\w./-]+\.(?:md|json|png|csv)"
  named = {m.rstrip(".,)") for t in texts for m in re.findall(pattern, t)}
  assert named, "the docs quote no results files at all"
  missing = sorted(p for p in named if not (root / p).exists())
  assert not missing, missing
