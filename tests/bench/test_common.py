"""The benchmark harness: metadata of results files, tables, charts, interleaved timing (no timing asserts)."""
from __future__ import annotations

import json
import re

from s3r.bench import common


def test_results_files_record_required_metadata(tmp_path, monkeypatch):
  monkeypatch.setattr("sys.argv", ["s3r", "bench", "ffn", "--shapes", "W1"])
  run = common.Run("unit", tmp_path, alpha=1, beta="x")
  paths = run.write({"rows": [1, 2]}, common.markdown_table(["a", "b"], [[1, 2]]),
                    chart=lambda p: common.bar_chart(p, ["g1", "g2"], {"s": [1.0, None]}, ylabel="y", title="t"))
  assert set(paths) == {"json", "md", "png"}
  assert paths["json"].name == f"bench_unit_{run.meta['platform']}.json"
  doc = json.loads(paths["json"].read_text())
  meta = doc["meta"]
  assert meta["command"] == "s3r bench ffn --shapes W1"
  assert re.fullmatch(r"[0-9a-f]{40}", meta["git"]["revision"])
  assert isinstance(meta["git"]["dirty"], bool)
  assert isinstance(meta["git"]["dirty_paths"], list) and meta["git"]["dirty"] == bool(meta["git"]["dirty_paths"])
  for key in ("jax_version", "jaxlib_version", "platform", "device_kind", "cpu_model", "cpu_count", "date_utc"):
    assert meta[key], key
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["date_utc"])
  assert len(meta["loadavg_before"]) == 3 and len(meta["loadavg_after"]) == 3
  assert doc["settings"] == {"alpha": 1, "beta": "x"}
  assert doc["results"] == {"rows": [1, 2]}
  md = paths["md"].read_text()
  for needle in ("s3r bench ffn --shapes W1", meta["git"]["revision"], "load average", meta["jax_version"], "| a | b |"):
    assert needle in md
  assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_table_escapes_and_aligns():
  table = common.markdown_table(["name", "value"], [["a|b", 1.5], ["c", None]])
  assert table.splitlines() == ["| name | value |", "| --- | --: |", "| a\\|b | 1.5 |", "| c |  |"]


def test_time_interleaved_times_each_config_once_per_round_in_varying_order():
  order = []
  names = ("a", "b", "c", "d")
  fns = {n: ((lambda n=n: order.append(n) or 0), ()) for n in names}
  out = common.time_interleaved(fns, repeats=12, warmup=1, number=2, prime=0)
  assert set(out) == set(names)
  assert all(len(t.samples) == 12 for t in out.values())
  timed = order[2 * len(names):]  # after the compile call + warm-up of each config
  assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))  # `number` calls back to back
  rounds = [timed[i:i + 2 * len(names):2] for i in range(0, len(timed), 2 * len(names))]
  assert all(sorted(r) == list(names) for r in rounds)  # every config once per round
  # what precedes "a" is not always the same config (a fixed rotation would put "d" before it)
  before_a = {r[r.index("a") - 1] for r in rounds if r.index("a") > 0}
  assert len(before_a) >= 2
  # the order is seeded: the same seed gives the same order
  again = []
  fns2 = {n: ((lambda n=n: again.append(n) or 0), ()) for n in names}
  common.time_interleaved(fns2, repeats=12, warmup=1, number=2, prime=0)
  assert again == order
  # by default one untimed call of the same configuration precedes each sample
  order.clear()
  common.time_interleaved(fns, repeats=2, warmup=0, number=2)
  timed = order[len(names):]
  assert all(timed[i:i + 3] == [timed[i]] * 3 for i in range(0, len(timed), 3))
  t = out["a"]
  assert t.q25 <= t.median <= t.q75 and t.iqr >= 0
  assert set(t.as_dict()) >= {"median_s", "iqr_s", "samples_s", "compile_s"}


def test_parse_shapes_accepts_paper_and_custom_shapes():
  assert common.parse_shapes("W1,W9") == {"W1": (512, 2048), "W9": (8192, 28672)}
  assert common.parse_shapes("64x128") == {"64x128": (64, 128)}
  assert len(common.parse_shapes("all")) == 9
  assert common.tokens_for("W1", None) == common.DEFAULT_TOKENS["W1"]
  assert common.tokens_for("64x128", 32) == 32
