"""`python -m benchmarks scan`: the step-time target's verdict from the paired interval (no timing asserts)."""

from __future__ import annotations

import argparse

from benchmarks import scan, timing


def test_the_step_time_target_is_met_missed_or_unresolved_by_the_95_percent_interval():
  assert scan.verdict((0.96, 1.10)) == "met"  # the scan at most 5% slower
  assert scan.verdict((0.90, 0.94)) == "missed"  # the scan more than 5% slower
  assert scan.verdict((0.93, 1.02)) == "not resolved"
  assert scan.verdict(None) == "too few rounds"


def test_ratios_pair_the_rounds_of_wall_and_cpu_seconds():
  loop = timing.Timing("loop", [1.2] * 8, cpu_samples=[2.0] * 8)
  scan_ = timing.Timing("scan", [1.0] * 8, cpu_samples=[2.0] * 8)
  wall, cpu = scan.ratios(loop, scan_), scan.ratios(loop.cpu(), scan_.cpu())
  assert wall["paired"] == wall["of_medians"] == 1.2 and wall["verdict"] == "met"
  assert cpu["paired"] == 1.0 and cpu["paired_ci95"] == (1.0, 1.0)
  args = argparse.Namespace(step_layers=2, step_batch=8, seq=256, repeats=8, prime=1)
  text = scan.markdown({"step": {"cpu-small": {"s3r": {"wall": wall, "cpu": cpu}}}}, args)
  assert "| s3r | 1000 | 1200 | 1.200 | 1.200-1.200 | met | 2000 | 2000 | 1.000 | 1.000-1.000 | met |" in text
