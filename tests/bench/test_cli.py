"""`s3r bench` registration: five sub-commands, each with --help and a func default."""

from __future__ import annotations

import argparse

import pytest

from s3r.bench import cli


def test_register_adds_bench_with_subcommands():
  parser = argparse.ArgumentParser(prog="s3r")
  cli.register(parser.add_subparsers(dest="command"))
  for name in ("ffn", "quantizer", "static", "peers", "step"):
    args = parser.parse_args(["bench", name])
    assert callable(args.func) and args.bench_command == name


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
