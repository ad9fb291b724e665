"""The benchmark harness: metadata of results files, tables, charts, interleaved timing (no timing asserts)."""
from __future__ import annotations

import collections
import json
import re

import pytest

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


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_balanced_orders_put_every_config_right_before_every_other_equally_often(n):
  orders = common.balanced_orders(n)
  assert len(orders) == (n if n % 2 == 0 else 2 * n)
  assert all(sorted(o) == list(range(n)) for o in orders)
  pairs = collections.Counter((o[k], o[k + 1]) for o in orders for k in range(n - 1))
  assert set(pairs) == {(i, j) for i in range(n) for j in range(n) if i != j}
  assert len(set(pairs.values())) <= 1  # every ordered pair equally often


def test_time_interleaved_times_each_config_once_per_round_in_balanced_orders():
  order = []
  names = ("a", "b", "c", "d")
  fns = {n: ((lambda n=n: order.append(n) or 0), ()) for n in names}
  out = common.time_interleaved(fns, repeats=8, warmup=1, number=2, prime=0)
  assert list(out) == list(names)  # results in the caller's order
  assert all(len(t.samples) == 8 for t in out.values())
  timed = order[2 * len(names):]  # after the compile call + warm-up of each config
  assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))  # `number` calls back to back
  rounds = [timed[i:i + 2 * len(names):2] for i in range(0, len(timed), 2 * len(names))]
  assert all(sorted(r) == list(names) for r in rounds)  # every config once per round
  pairs = collections.Counter((r[k], r[k + 1]) for r in rounds for k in range(len(names) - 1))
  assert len(pairs) == 12 and set(pairs.values()) == {2}  # 8 rounds = the 4-round design twice
  # the seed only relabels the design: another seed gives another order, the same seed the same
  again = []
  fns2 = {n: ((lambda n=n: again.append(n) or 0), ()) for n in names}
  common.time_interleaved(fns2, repeats=8, warmup=1, number=2, prime=0, seed=1)
  assert again[2 * len(names):] != timed
  again.clear()
  common.time_interleaved(fns2, repeats=8, warmup=1, number=2, prime=0)
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
