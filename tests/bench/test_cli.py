"""`python -m benchmarks`: every sub-command parses, has a func default and documents its flags."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import cli


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_dispatches_to_its_runner(name):
  parser = cli.build_parser()
  sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
  assert callable(sub.get_default("func")) and sub.get_default("bench_command") == name


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_documents_its_flags(name, capsys):
  with pytest.raises(SystemExit) as e:
    cli.build_parser().parse_args([name, "--help"])
  assert e.value.code == 0
  text = capsys.readouterr().out
  parser = cli.build_parser()
  sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
  for action in sub._actions:
    if action.option_strings and action.dest != "help":
      assert action.help, f"{name} {action.option_strings} has no help"
      assert action.option_strings[-1] in text
