"""Summarizes the barrier A/B in this folder: `python docs/notes/barrier-ab/summarize.py`.

Inputs were made by ab.sh (two alternating rounds: main at cb59fa4, then the same tree with
../quantizer-barrier-consistent.diff applied); ratios are within one run, as the benches report.
"""
import json
import pathlib

HERE = pathlib.Path(__file__).parent


def ffn_ratio(path, recipe, ref="int8_rtne"):
  out = {}
  for row in json.loads(path.read_text())["results"]:
    t = {r: v["timing"]["median_s"] for r, v in row["recipes"].items()}
    out[row["shape"]] = t[recipe] / t[ref]
  return out


def quantizer(path, config, ref):
  out = {}
  for row in json.loads(path.read_text())["results"]:
    t = {c: v["timing"]["median_s"] for c, v in row["configs"].items()}
    out[row["shape"]] = t[config] / t[ref]
  return out


def main():
  print("| tree | round | FFN s3r_ec_dx / int8_rtne (W2, W3, W4) | quantizer s3r / int8_rtne | quantizer s3r / floor_2pass | "
        "quantizer s3r ms at W3 |")
  print("|---|---|---|---|---|---|")
  for tree in ("main", "barrier-tree"):
    for i in (1, 2):
      f = ffn_ratio(HERE / f"{tree}-ffn-{i}.json", "s3r_ec_dx")
      q = HERE / f"{tree}-q-{i}.json"
      qr, qf = quantizer(q, "s3r", "int8_rtne"), quantizer(q, "s3r", "floor_2pass")
      w3 = next(r for r in json.loads(q.read_text())["results"] if r["shape"] == "W3")
      fmt = lambda d: ", ".join(f"{v:.2f}" for v in d.values())
      print(f"| {tree} | {i} | {fmt(f)} | {fmt(qr)} | {fmt(qf)} | {w3['configs']['s3r']['timing']['median_s'] * 1e3:.1f} |")


if __name__ == "__main__":
  main()
