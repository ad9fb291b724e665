"""`pip install s3r` installs the library and the trainer, and nothing of the research tooling.

Builds the wheel, installs it (without its dependencies) into a fresh virtual environment whose
third-party packages come from the test environment (a `.pth` line; the checkout's own `s3r` is
not reachable from there), and runs `s3r train` and the README's Python snippet from a folder
outside the repository.
"""

from __future__ import annotations

import os
import pathlib
import re
import site
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _run(argv, **kw) -> subprocess.CompletedProcess:
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
  assert proc.returncode == 0, f"{' '.join(map(str, argv))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("wheel")
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)])
  (found,) = out.glob("s3r-*.whl")
  return found


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> dict:
  venv = tmp_path_factory.mktemp("venv") / "fresh"
  _run([sys.executable, "-m", "venv", str(venv)])
  python = venv / "bin" / "python"
  _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
  purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
  (pathlib.Path(purelib) / "test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "S3R_DATA")}
  return {"python": python, "bin": venv / "bin", "env": env, "cwd": tmp_path_factory.mktemp("elsewhere")}


def test_the_wheel_holds_the_library_and_no_research_tooling(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
  assert tops == {"s3r"}, tops
  for module in ("s3r/quant/matmul.py", "s3r/train/loop.py", "s3r/cli/__init__.py", "s3r/model/presets.py"):
    assert module in names, module


def test_installed_package_imports_from_the_wheel_not_the_checkout(fresh_env):
  where = _run(
    [str(fresh_env["python"]), "-c", "import s3r; print(s3r.__file__)"], cwd=fresh_env["cwd"], env=fresh_env["env"]
  ).stdout.strip()
  assert pathlib.Path(where).is_relative_to(fresh_env["bin"].parent), where
  for tooling in ("benchmarks", "research", "labtools"):
    proc = subprocess.run(
      [str(fresh_env["python"]), "-c", f"import {tooling}"],
      capture_output=True,
      text=True,
      cwd=fresh_env["cwd"],
      env=fresh_env["env"],
    )
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, tooling


@pytest.mark.slow
def test_installed_s3r_trains_three_steps_outside_the_repository(fresh_env, tmp_path):
  corpus = tmp_path / "corpus.txt"
  documents = (" ".join(f"Sentence {j} of document {i}: the cat sat on the mat." for j in range(60)) for i in range(40))
  corpus.write_text("\n\n\n".join(documents) + "\n")
  proc = _run(
    [str(fresh_env["bin"] / "s3r"), "train", "--preset", "tiny", "--steps", "3", "--warmup", "1", "--batch", "2"]
    + ["--seq", "32", "--eval-every", "3", "--eval-batches", "1", "--data", str(corpus), "--out", "run"]
    + ["--no-progress"],
    cwd=fresh_env["cwd"],
    env=fresh_env["env"],
  )
  assert "final validation loss" in proc.stdout + proc.stderr
  assert (fresh_env["cwd"] / "run" / "metrics.jsonl").exists()


def test_installed_s3r_runs_the_readme_python_snippet(fresh_env):
  snippet = re.findall(r"```python\n(.*?)```", README, flags=re.S)[0]
  snippet += "\nassert dx.shape == (8, 256, 1024) and dw.shape == (1024, 4096)\nprint('ok')\n"
  proc = _run([str(fresh_env["python"]), "-c", snippet], cwd=fresh_env["cwd"], env=fresh_env["env"])
  assert proc.stdout.strip().endswith("ok")
