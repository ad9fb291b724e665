"""`s3r train` multi-process flags: bad combinations are refused in one line, before JAX starts."""

import re

import pytest

from s3r import cli


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--num-processes", "2"], "need --coordinator"),
    (["--process-id", "1"], "need --coordinator"),
    (["--coordinator", "127.0.0.1:1234"], "needs --num-processes and --process-id"),
    (
      ["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "2"],
      r"--process-id must be in \[0, 2\)",
    ),
  ],
)
def test_inconsistent_process_flags_are_refused(flags, message, capsys, monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(var, raising=False)
  assert cli.main(["train", "--preset", "tiny", *flags]) == 2
  err = capsys.readouterr().err
  assert err.startswith("s3r: error:") and len(err.strip().splitlines()) == 1
  assert re.search(message, err), err


def test_process_flags_default_to_the_standard_environment(monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:8476")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  args = cli.build_parser(["train"]).parse_args(["train"])
  assert (args.coordinator, args.num_processes, args.process_id) == ("10.0.0.1:8476", 4, 3)
