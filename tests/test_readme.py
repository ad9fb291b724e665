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


def test_readme_names_the_ci_test_command():
  ci = (pathlib.Path(__file__).parents[1] / ".ci" / "run").read_text()
  assert "make test" in README and "test" in ci
