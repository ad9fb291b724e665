"""Resuming: the run a folder holds (read once), and meshes that fit fewer devices."""

import json

import pytest

from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import resume


def test_find_run_refuses_a_folder_without_a_run_and_creates_nothing(tmp_path):
  with pytest.raises(ConfigError, match="holds no run"):
    resume.find_run(tmp_path / "typo")
  assert not (tmp_path / "typo").exists()


def test_find_run_of_a_run_without_checkpoints_reads_its_config_json(tmp_path):
  cfg = TrainConfig(out=str(tmp_path), preset="tiny", steps=12)
  (tmp_path / "config.json").write_text(json.dumps({"train": cfg.to_dict()}))
  saved = resume.find_run(tmp_path)
  assert (saved.config, saved.step, saved.meta) == (cfg, None, None)


@pytest.mark.parametrize(
  "spec, n_devices, shrunk",
  [
    ("data=2", 1, "data=1"),
    ("data=4", 2, "data=2"),
    ("data=2,fsdp=2,tensor=2", 4, "fsdp=2,tensor=2"),
    ("data=2,tensor=4", 2, "tensor=2"),
    ("data=2", 3, None),
    ("bogus=2", 1, None),
  ],
)
def test_shrink_mesh_keeps_the_model_parallel_axes_largest(spec, n_devices, shrunk):
  assert resume.shrink_mesh(spec, n_devices) == shrunk


def test_a_mesh_that_does_not_fit_falls_back_to_one_that_does_and_says_so():
  cfg = TrainConfig(out="run", preset="tiny", batch=4, mesh="data=2", resume=True)
  fitted, note = resume.mesh_for_resume(cfg)
  assert fitted.mesh == "data=1" and note is not None and "does not fit the 1 device(s) present" in note
  assert resume.mesh_for_resume(fitted) == (fitted, None)
  assert "--mesh data=1 fits" in resume.mesh_hint(cfg) and "reshard" in resume.mesh_hint(cfg)
