"""docs/training.md's examples run as written: each block marked `<!-- example: run by tests/test_training_doc.py`
(Python that writes a corpus, a TOML config file named in its first line, `s3r train` commands), in order, in one
fresh folder; then what each run wrote is what the page says. The page's grad-accumulation memory numbers are the
committed results files'."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import pathlib
import re
import shlex

import pytest

from s3r import cli
from s3r.cli import train as cli_train
from s3r.cli.config_file import apply_config_file
from s3r.train.config import TrainConfig
from tests.faults.conftest import run_in_process

DOC = pathlib.Path(__file__).parents[1] / "docs" / "training.md"
MARK = "<!-- example: run by tests/test_training_doc.py"
NEEDS_DATASETS = "(with datasets installed)"


def examples(text: str) -> list[tuple[str, str, str]]:
  """(marker line, info string, body) of every marked fenced block, in order."""
  found = re.findall(r"^(<!-- example:[^\n]*-->)\n```(\w+)\n(.*?)^```", text, flags=re.S | re.M)
  assert len(found) == text.count(MARK), "a marked example is not followed by a fenced block"
  return found


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
  """Runs every example in one folder; {s3r command line: its CompletedProcess} and the folder."""
  pytest.importorskip("pyarrow", reason="the Parquet example needs pyarrow (pip install 's3r[parquet]')")
  folder = tmp_path_factory.mktemp("training_doc")
  have_datasets = importlib.util.find_spec("datasets") is not None
  commands = {}
  for marker, kind, body in examples(DOC.read_text()):
    if NEEDS_DATASETS in marker and not have_datasets:
      continue
    if kind == "python":
      with contextlib.chdir(folder):
        exec(compile(body, f"{DOC.name} example", "exec"), {})
    elif kind == "toml":
      name = body.splitlines()[0].removeprefix("#").strip()
      (folder / name).write_text(body)
    else:
      assert kind == "bash", kind
      for line in body.splitlines():
        assert line.startswith("s3r train "), line
        commands[line] = run_in_process(*shlex.split(line)[1:], cwd=folder)
  return commands, folder


@pytest.mark.slow  # four example trainings (about 2 minutes); each feature has fast tests of its own
def test_every_example_command_of_the_training_doc_runs_as_written(ran):
  commands, _ = ran
  assert len(commands) >= 3
  for line, proc in commands.items():
    assert proc.returncode == 0, (line, proc.stderr[-2000:])


def _saved(folder: pathlib.Path, run: str) -> dict:
  return json.loads((folder / "runs" / run / "config.json").read_text())


def _records(folder: pathlib.Path, run: str) -> list[dict]:
  return [json.loads(line) for line in (folder / "runs" / run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # four example trainings (about 2 minutes); each feature has fast tests of its own
def test_the_config_file_example_takes_the_files_settings_under_the_flags_and_its_config_json_is_a_config(ran):
  _, folder = ran
  saved = _saved(folder, "from-file")["train"]
  assert (saved["preset"], saved["grad_accum"], saved["batch"], saved["max_train_docs"]) == ("tiny", 2, 8, 200)
  assert saved["steps"] == 4 and [r["step"] for r in _records(folder, "from-file")] == list(range(5))  # the flag
  parser = cli.build_parser(["train"])
  args = parser.parse_args(["train", "--config", str(folder / "runs/from-file/config.json"), "--out", "again"])
  apply_config_file(args, args.config)
  assert cli_train.train_config(args) == TrainConfig.from_dict({**saved, "out": "again", "resume": False})


@pytest.mark.slow  # four example trainings (about 2 minutes); each feature has fast tests of its own
def test_the_grad_accum_example_trains_on_the_global_batch(ran):
  _, folder = ran
  saved = _saved(folder, "accum")
  assert (saved["train"]["batch"], saved["train"]["grad_accum"]) == (8, 2)
  records = _records(folder, "accum")
  assert [r["step"] for r in records] == list(range(5)) and "val_loss" in records[-1]


@pytest.mark.slow  # four example trainings (about 2 minutes); each feature has fast tests of its own
def test_the_parquet_and_datasets_examples_train_on_the_text_column(ran):
  commands, folder = ran
  runs = ["parquet"] + (["dataset"] if any("code-dataset" in c for c in commands) else [])
  for run in runs:
    saved = _saved(folder, run)
    assert saved["train"]["text_column"] == "source" and saved["data"]["n_docs"]["train"] > 50, run
  if len(runs) == 2:  # the same rows: the same documents, split alike
    assert _saved(folder, "parquet")["data"]["n_docs"] == _saved(folder, "dataset")["data"]["n_docs"]


ROOT = DOC.parents[1]
AOT_RESULTS = ROOT / "results" / "aot" / "bench_aot_h100_grad_accum_cpu.json"
STEP_RESULTS = ROOT / "results" / "grad_accum" / "bench_step_grad_accum_{n}_cpu.json"


def grad_accum_memory_rows() -> list[list[str]]:
  """The rows of the page's grad-accumulation memory table, from the committed results: per N, the temporaries of
  the H100 train step (`benchmarks aot`, GiB) and of the CPU train step (`benchmarks step`, MiB) with N / 1."""
  aot = {r.get("grad_accum", 1): r["memory"]["temp"] for r in json.loads(AOT_RESULTS.read_text())["results"]}
  cpu = {}
  for n in aot:
    doc = json.loads(pathlib.Path(str(STEP_RESULTS).format(n=n)).read_text())
    assert doc["complete"] and doc["settings"]["grad_accum"] == n
    cpu[n] = doc["results"]["configs"][0]["recipes"]["s3r_ec_dx"]["memory"]["temp"]
  return [
    [str(n), f"{aot[n] / 2**30:.2f}", f"{aot[n] / aot[1]:.2f}", f"{cpu[n] / 2**20:.1f}", f"{cpu[n] / cpu[1]:.2f}"]
    for n in sorted(aot)
  ]


def test_the_grad_accum_memory_table_is_the_committed_results():
  text = DOC.read_text()
  section = text[text.index("### Memory of the accumulating step") :].splitlines()
  start = next(i for i, ln in enumerate(section) if ln.startswith("|"))
  end = next(i for i in range(start, len(section)) if not section[i].startswith("|"))
  rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section[start + 2 : end]]
  assert rows == grad_accum_memory_rows()
