"""A recipe is parsed once, where the user's string comes in (the `--recipe` flag, a config file, a config's field,
a public function's argument), by `s3r.quant.recipes.parse`; every layer below gets the typed Recipe."""

import ast
import pathlib

import jax
import numpy as np
import pytest

from s3r import cli
from s3r.cli import train as cli_train
from s3r.quant import recipes
from s3r.train.builder import build, make_mesh

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
  """The names that `parse` reads from now on."""
  names = []
  parse = recipes.parse
  monkeypatch.setattr(recipes, "parse", lambda name: (names.append(name), parse(name))[1])
  return names


def test_a_training_setup_parses_its_recipe_name_once_from_the_flag_to_the_traced_step(parsed):
  argv = ["train", "--preset", "moe-tiny", "--recipe", "s3r_ec_dx@int4", "--batch", "2"]
  args = cli.build_parser(argv).parse_args(argv)
  assert cli_train.train_out(args) == "runs/moe-tiny-s3r_ec_dx@int4"  # a Recipe prints as its name
  cfg = cli_train.train_config(args)
  setup = build(cfg, cfg.vocab_size, make_mesh(cfg))
  batch = jax.ShapeDtypeStruct(cfg.batch_shape, np.int32, sharding=setup.batch_sharding)
  setup.train_step.trace(setup.abstract_state, batch, setup.keys["train"])  # every qmatmul and grouped GEMM
  assert parsed == ["s3r_ec_dx@int4"]
  assert setup.model_cfg.recipe is cfg.recipe is args.recipe


def test_a_config_read_back_parses_the_saved_name_once(parsed):
  from s3r.train.config import TrainConfig

  saved = TrainConfig(out="run", recipe="int8_sr").to_dict()
  assert saved["recipe"] == "int8_sr"  # config.json holds the name
  parsed.clear()
  cfg = TrainConfig.from_dict(saved)
  cfg.model_config(cfg.vocab_size)
  assert parsed == ["int8_sr"] and cfg.to_dict() == saved


def _calls_of_the_parser(path: pathlib.Path) -> list[str]:
  """The recipe parser's entry points that the module at `path` calls (`recipe`, `get_recipe`, `check_recipe`,
  `parse`, `s3r.recipe`, `recipes.parse`) or indexes (`RECIPES[...]`)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
      if node.func.id in ("recipe", "get_recipe", "check_recipe", "parse"):
        found.append(node.func.id)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      if node.func.attr in ("recipe", "check_recipe") or ast.unparse(node.func) == "recipes.parse":
        found.append(ast.unparse(node.func))
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "RECIPES":
      found.append("RECIPES[]")
  return found


# Where a user's recipe comes in: the public functions and modules that accept a name, and the config field.
EDGES = {
  "s3r/quant/recipes.py",  # the parser itself, and RecipeField (every config's recipe field)
  "s3r/quant/arguments.py",  # qmatmul, gradient_codes, grouped_qmatmul: a name or a Recipe
  "s3r/quant/matmul.py",  # quantize_gradient (through arguments.check_recipe)
  "s3r/cli/common.py",  # --recipe
  "s3r/model/moe.py",  # MoEFeedForward(recipe=...)
  "s3r/nn/dot_general.py",  # s3r.nn's layers and dot_general
  "s3r/nn/quantize.py",
  "s3r/nn/intercept.py",
  "s3r/nn/grouped.py",
  "s3r/integrations/maxtext.py",  # the MaxText quantization string
}


def test_only_the_entry_points_call_the_recipe_parser():
  callers = {str(p.relative_to(ROOT)) for p in (ROOT / "s3r").rglob("*.py") if _calls_of_the_parser(p)}
  assert callers <= EDGES, sorted(callers - EDGES)
  for layer in ("model/config.py", "model/transformer.py", "model/generation.py", "model/layers.py", "train/config.py"):
    assert not _calls_of_the_parser(ROOT / "s3r" / layer), layer
