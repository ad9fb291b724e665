"""Reading a run directory into the summary a results file records."""

import json

from labtools.results import REPO_ROOT
from research import runs


def test_run_summary_records_no_machine_paths(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  data = str(REPO_ROOT.parent / "shared" / "data" / "enwiki")  # the corpora beside the repository
  cache = str(REPO_ROOT / ".cache" / "s3r")
  train = {"out": "/somewhere/else/runs/sweeps/x", "data": data, "cache_dir": cache, "lr": 0.002}
  (run / "config.json").write_text(json.dumps({"train": train, "param_count": 10}))
  lines = [{"step": 0, "loss": 5.0}, {"step": 1, "loss": 4.9, "step_time_s": 0.5}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  summary = runs.summarize_run(run, recipe="s3r", lr=0.002, seed=0, status="done", wall_s=1.0)
  recorded = summary["train_config"]
  assert recorded["out"] == "runs/sweeps/x" and recorded["lr"] == 0.002
  assert recorded["data"] == "../shared/data/enwiki" and recorded["cache_dir"] == ".cache/s3r"
