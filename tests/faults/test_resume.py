"""Faults of `s3r train --resume`: a folder without a run, damaged or missing checkpoints, a changed corpus,
changed settings, fewer devices than the run's mesh."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

from tests.conftest import xla_flags
from tests.faults.conftest import REPO, assert_one_line_error, metrics_lines, snapshot, write_corpus


def test_resume_refuses_a_folder_without_a_run_and_creates_nothing(cli, tmp_path):
  typo, cache = tmp_path / "TYPO", tmp_path / "cache"
  proc = cli("train", "--out", typo, "--resume", "--cache-dir", cache, "--no-progress")
  assert_one_line_error(proc, 2, f"{typo} holds no run", "drop --resume")
  assert not typo.exists() and not cache.exists()
  assert "step" not in proc.stdout


def test_resume_past_a_garbled_latest_meta_says_so_once_and_continues_from_the_step_before(cli, run_copy):
  (run_copy / "checkpoints" / "6" / "meta" / "metadata").write_text("{not json")
  proc = cli("train", "--out", run_copy, "--resume")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count("checkpoint: using step 4") == 1, proc.stdout
  assert f"resume: restored step 4 from {run_copy / 'checkpoints' / '4'}" in proc.stdout
  assert [json.loads(line)["step"] for line in metrics_lines(run_copy)] == list(range(7))


def test_resume_with_every_checkpoint_damaged_fails_in_one_line_and_changes_nothing(cli, run_copy):
  for step in (4, 6):
    (run_copy / "checkpoints" / str(step) / "meta" / "metadata").write_text("{not json")
  before = snapshot(run_copy)
  proc = cli("train", "--out", run_copy, "--resume")
  assert_one_line_error(proc, 2, "no readable checkpoint", "start a new run with another --out")
  assert snapshot(run_copy) == before


def test_resume_of_a_run_without_checkpoints_starts_over_with_the_runs_settings(cli, run_copy):
  shutil.rmtree(run_copy / "checkpoints")
  proc = cli("train", "--out", run_copy, "--resume")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resume: no checkpoint in" in proc.stdout and "steps 0->6, batch 2 x seq 32" in proc.stdout
  assert (run_copy / "checkpoints" / "6").is_dir()
  assert [json.loads(line)["step"] for line in metrics_lines(run_copy)] == list(range(7))  # each step once


def test_a_resume_with_no_step_left_says_so_and_reports_the_final_steps_own_validation_loss(cli, run_copy):
  """Resumed at step 4 (its newest checkpoint) with --steps 4: no step runs; the loss printed as final is
  the step-4 state's, the number `s3r eval` gives for that checkpoint, not the last one on file (step 3's)."""
  shutil.rmtree(run_copy / "checkpoints" / "6")
  proc = cli("train", "--out", run_copy, "--resume", "--steps", "4", in_process=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "the run is at step 4 of 4 already; no step to run" in proc.stdout
  final = re.search(r"final validation loss \(step 4\): val_loss (\S+)", proc.stdout)
  evaluated = cli("eval", run_copy, in_process=True)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert final and f"val: loss {final[1]}," in evaluated.stdout, (proc.stdout, evaluated.stdout)
  on_file = [json.loads(line) for line in metrics_lines(run_copy)]
  assert [r["step"] for r in on_file] == list(range(5))
  assert f"{on_file[3]['val_loss']:.4f}" != final[1]


def test_restarts_before_the_first_checkpoint_leave_one_record_per_step(cli, tmp_path):
  """A run stopped before its first checkpoint (here: steps 1 and 2 of 6, checkpoints every 4),
  resumed twice: its metrics file holds step 0 once, not once per restart."""
  out = tmp_path / "run"
  first = cli.train(out, "--steps", "2", "--ckpt-every", "4", "--eval-every", "4", in_process=True)
  assert first.returncode == 0, first.stderr[-3000:]
  shutil.rmtree(out / "checkpoints")  # what a kill before the first save leaves: metrics without checkpoints
  for _ in range(2):
    proc = cli("train", "--out", out, "--resume", "--steps", "2", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(out / "checkpoints")
  assert [json.loads(line)["step"] for line in metrics_lines(out)] == [0, 1, 2]


def test_resume_with_another_recipe_is_refused_naming_the_flag_and_changes_nothing(cli, run_copy):
  before = snapshot(run_copy)
  proc = cli("train", "--out", run_copy, "--resume", "--recipe", "int8_sr")
  assert_one_line_error(proc, 2, "--resume with a different configuration", "--recipe")
  assert snapshot(run_copy) == before


@pytest.fixture(scope="module")
def own_corpus_run(cli, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(a finished 6-step run, the corpus file it trained on) that no other test's run reads."""
  root = tmp_path_factory.mktemp("own-corpus")
  corpus = write_corpus(root / "corpus")
  out = root / "run"
  proc = cli.train(out, data=corpus)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, corpus / "docs.txt"


@pytest.fixture
def changed_corpus(own_corpus_run, tmp_path):
  """(a copy of the run, its corpus file): the test changes the file, which is restored afterwards."""
  out, docs = own_corpus_run
  original = docs.read_bytes()
  shutil.copytree(out, tmp_path / "run")
  try:
    yield tmp_path / "run", docs
  finally:
    docs.write_bytes(original)


def _documents(docs: pathlib.Path) -> list[str]:
  return docs.read_text().split("\n\n\n")


@pytest.mark.parametrize("change", ["two-documents-appended", "file-shortened"])
def test_resume_after_the_corpus_changed_is_refused_in_one_line_and_changes_nothing(cli, changed_corpus, change):
  out, docs = changed_corpus
  texts = _documents(docs)
  if change == "two-documents-appended":
    texts += [" ".join(reversed(texts[0].split())), " ".join(texts[1].split()[::2])]
  else:
    texts = texts[: len(texts) * 2 // 3]
  docs.write_text("\n\n\n".join(texts))
  before = snapshot(out)
  proc = cli("train", "--out", out, "--resume", "--steps", "8")
  assert_one_line_error(proc, 2, "the corpus changed since the checkpoint", "restore the run's corpus", "new run")
  assert snapshot(out) == before


def _train_on_two_devices(cli, out: pathlib.Path) -> None:
  env = {**cli.env, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")}
  argv = cli.argv(*cli.train_args(out, "--mesh", "data=2"))
  proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def two_device_run(cli, tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("two-devices") / "run"
  _train_on_two_devices(cli, out)
  return out


@pytest.mark.slow
def test_resume_on_fewer_devices_without_mesh_falls_back_to_a_mesh_that_fits_and_says_so(cli, two_device_run, tmp_path):
  out = tmp_path / "run"
  shutil.copytree(two_device_run, out)
  proc = cli("train", "--out", out, "--resume", "--steps", "8")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resume: the run's mesh data=2 does not fit the 1 device(s) present; using --mesh data=1" in proc.stdout
  assert [json.loads(line)["step"] for line in metrics_lines(out)] == list(range(9))
  assert json.loads((out / "config.json").read_text())["mesh"]["data"] == 1


@pytest.mark.slow  # a 2-device run first (30 s); tests/distributed/test_checkpoint_reshard.py resumes on other meshes
def test_resume_with_a_mesh_that_does_not_fit_names_one_that_does_and_changes_nothing(cli, two_device_run, tmp_path):
  out = tmp_path / "run"
  shutil.copytree(two_device_run, out)
  before = snapshot(out)
  proc = cli("train", "--out", out, "--resume", "--mesh", "data=2")
  assert_one_line_error(proc, 2, "--mesh data=2", "--mesh data=1 fits the 1 device(s) present", "reshard")
  assert snapshot(out) == before
