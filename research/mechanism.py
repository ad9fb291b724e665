"""Proposition 1's mechanism, measured per projection: the common row component of W against the extra
activation-gradient error of per-token sharing.

For a projection Y = X W (W [K, N]) the backward rounds G' = s_x G s_w with step Δ into codes Q; the
dX error is (Δ/s_x) E Ŵᵀ and the dW error (Δ/s_w) X̂ᵀ E, with E = Q - G'/Δ and Ŵ, X̂ the int8 codes.
Per token the N errors of S3R share one threshold. With evenly spread residuals (variance Δ²/6,
covariance Δ²/12, Section III) the summed dX variance of S3R over independent SR is
  (1 + ρ) / 2,   ρ = Σ_i (Ŵ_i 1_N)² / Σ_i ||Ŵ_i||²   (rows Ŵ_i over the N outputs that share a threshold),
so the predicted error ratio is sqrt((1 + ρ) / 2). `token_centred` is S3R with each token's error
centred (its row mean subtracted): the row part of S3R-EC's dX term only, not the `s3r_ec_dx` recipe,
whose two-way projection also subtracts the channel means of each example (those couple the tokens,
so the recipe cannot be enumerated token by token). Results written before this name existed call
this column `s3r_ec_dx`.

Errors are exact, not sampled: for int8_sr Var(E) = p(1-p) per element; for s3r and token_centred every
one of the 128 values of the 7-bit threshold (s3r.quant.thresholds) is enumerated per token (tokens
are independent). Relative error = sqrt(summed variance) / ||exact product|| over the measured tokens.

Studies (`python -m research.mechanism`): `scale` trains small models of several widths and
depths for a few steps and measures along the way; `checkpoints` measures saved runs. Results are
appended to the output JSON as each measurement finishes (resumable: finished entries are skipped).

Dimension letters: B batch, S sequence, T = B*S tokens, K inputs, N outputs, L threshold levels.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from labtools import results as provenance
from research import gradients
from s3r import data as s3r_data
from s3r import model as s3r_model
from s3r.quant import numerics, thresholds
from s3r.train.step import init_state, make_train_step
from s3r.train.step.optimizer import OptimizerConfig, make_optimizer, schedule

RECIPES = ("int8_sr", "s3r", "s3r_ec_dx")  # the recipes of the propagated errors (research.diagnose)
TOKEN_CENTRED = "token_centred"  # s3r with each token's error centred (see the module docstring)


def projection_operands(cfg: s3r_model.ModelConfig, params, batch_BxS1) -> list[tuple]:
  """[(layer, name, x_BxSxK, w_KxN, g_BxSxN)]: inputs, weights and exact upstream gradients of every
  block projection (the INT8 forward graph with an exact backward)."""
  # unrolled, as the committed results were computed (a scanned program may round bf16 differently)
  exact_bwd = dataclasses.replace(cfg, recipe="int8_exact_bwd", scan_layers=False)
  names = [(layer, name) for layer in range(cfg.n_layers) for name in s3r_model.PROJECTIONS]
  run = jax.jit(lambda params, batch: gradients.projection_gradients(exact_bwd, params, batch))
  out = run(params, jnp.asarray(batch_BxS1))
  return [(layer, name, *map(np.asarray, ops)) for (layer, name), ops in zip(names, out)]


def common_row_statistic(wq_KxN: np.ndarray) -> float:
  """ρ = Σ_i (Ŵ_i 1_N)² / Σ_i ||Ŵ_i||² (1 for unstructured rows, up to N for identical entries)."""
  w = np.asarray(wq_KxN, np.float64)
  return float(np.sum(w.sum(axis=1) ** 2) / np.sum(w**2))


def scaled_gradient(x_BxSxK, w_KxN, g_BxSxN):
  """(x, w in f32, s_x [B, S], s_w [N], G' = s_x G s_w [B, S, N]): what the backward rounds, before Δ."""
  x, w, g = (jnp.asarray(a, jnp.float32) for a in (x_BxSxK, w_KxN, g_BxSxN))
  sx_BxS, sw_N = numerics.absmax_scale(x, axis=-1), numerics.absmax_scale(w, axis=0)
  return x, w, sx_BxS, sw_N, sx_BxS[..., None] * g * sw_N


def local_errors(x_BxSxK, w_KxN, g_BxSxN, *, tokens: int) -> dict:
  """ρ of the weight codes and the exact relative dX / dW errors of each recipe on the first `tokens`
  tokens (Δ from the whole batch, as the backward computes it)."""
  x, w, sx_BxS, sw_N, gp = scaled_gradient(x_BxSxK, w_KxN, g_BxSxN)
  delta = float(jnp.max(jnp.abs(gp)) / numerics.QMAX) or 1.0
  v_TxN = np.asarray(gp, np.float64).reshape(-1, gp.shape[-1])[:tokens] / delta
  sx_T = np.asarray(sx_BxS, np.float64).reshape(-1)[:tokens]
  wq = np.asarray(numerics.quantize_rtne(w, sw_N), np.float64)
  xq = np.asarray(numerics.quantize_rtne(x, sx_BxS[..., None]), np.float64).reshape(-1, w.shape[0])[:tokens]
  sw = np.asarray(sw_N, np.float64)
  p = v_TxN - np.floor(v_TxN)
  exact_dx = np.linalg.norm((v_TxN @ wq.T) / sx_T[:, None])
  exact_dw = np.linalg.norm((xq.T @ v_TxN) / sw)
  # independent SR: Var(E) = p(1-p) per element
  var_sr = p * (1 - p)
  dx_var = {"int8_sr": float(np.sum((var_sr @ wq.T**2) / sx_T[:, None] ** 2))}
  dw_sr = float(np.sum(((xq**2).T @ var_sr) / sw**2))
  # per-token shared thresholds: enumerate the 128 equally likely values
  s1, s2, s1c, s2c, e1, e2 = (0.0,) * 6
  for u in np.asarray(thresholds.threshold_values(), np.float64):
    e_TxN = np.floor(v_TxN + u) - v_TxN
    r = e_TxN @ wq.T
    rc = r - e_TxN.mean(axis=1, keepdims=True) * wq.sum(axis=1)[None, :]
    s1, s2 = s1 + r, s2 + r**2
    s1c, s2c = s1c + rc, s2c + rc**2
    e1, e2 = e1 + e_TxN, e2 + e_TxN**2
  n_levels = thresholds.LEVELS
  wgt = 1 / sx_T[:, None] ** 2
  dx_var["s3r"] = float(np.sum((s2 / n_levels - (s1 / n_levels) ** 2) * wgt))
  dx_var[TOKEN_CENTRED] = float(np.sum((s2c / n_levels - (s1c / n_levels) ** 2) * wgt))
  var_tok = e2 / n_levels - (e1 / n_levels) ** 2
  dw_tok = float(np.sum(((xq**2).T @ var_tok) / sw**2))  # tokens independent: per-element variances add
  rho = common_row_statistic(wq)
  dx = {r: float(np.sqrt(v) / exact_dx) for r, v in dx_var.items()}
  dw = {"int8_sr": float(np.sqrt(dw_sr) / exact_dw), "s3r": float(np.sqrt(dw_tok) / exact_dw)}
  dw[TOKEN_CENTRED] = dw["s3r"]  # centring the dX term leaves dW unchanged
  return {
    "rho": rho,
    "N": int(w.shape[1]),
    "K": int(w.shape[0]),
    "tokens": int(len(v_TxN)),
    "dx": dx,
    "dw": dw,
    "dx_ratio": dx["s3r"] / dx["int8_sr"],
    "dx_ratio_pred": float(np.sqrt((1 + rho) / 2)),
    "ec_ratio": dx[TOKEN_CENTRED] / dx["int8_sr"],
    "dw_ratio": dw["s3r"] / dw["int8_sr"],
    "mean_p1mp": float(np.mean(var_sr)),
  }


def measure(cfg, params, batch_BxS1, *, tokens: int) -> list[dict]:
  """local_errors of every block projection."""
  return [
    {"layer": layer, "proj": name, **local_errors(x, w, g, tokens=tokens)}
    for layer, name, x, w, g in projection_operands(cfg, params, batch_BxS1)
  ]


# --- studies --------------------------------------------------------------------------------------

# (name, d_model, n_layers, n_heads, n_kv_heads, d_ff, measured tokens): head dim 32, d_ff ~ 8/3 width
SCALE_MODELS = (
  ("w192-d4", 192, 4, 6, 2, 512, 256),
  ("w384-d4", 384, 4, 12, 4, 1024, 128),
  ("w768-d4", 768, 4, 24, 8, 2048, 64),
  ("w192-d8", 192, 8, 6, 2, 512, 256),
  ("w192-d12", 192, 12, 6, 2, 512, 256),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleStudy:
  """Short trainings of SCALE_MODELS, measured at `measure_at` steps."""

  data: str = "shakespeare"  # corpus (small: the trainings are short)
  vocab: int = 1024  # tokenizer vocabulary
  cache_dir: str = ".cache/s3r"  # tokenizer and token cache
  recipe: str = "int8_sr"  # recipe the models are trained with (the baseline of the ratios)
  steps: int = 100  # schedule length
  measure_at: tuple[int, ...] = (0, 25, 100)  # steps at which the projections are measured
  batch: int = 4  # sequences per step
  seq: int = 128  # tokens per sequence
  lr: float = 2e-3  # peak learning rate (warm-up 10 steps, cosine)
  seed: int = 0  # parameters and batch order

  def __post_init__(self):
    if any(s < 0 or s > self.steps for s in self.measure_at):
      raise ValueError(f"ScaleStudy.measure_at must lie in [0, steps={self.steps}], got {self.measure_at}")


def _summarize(rows: list[dict]) -> dict:
  """Median and maximum over all projections, and medians over the gate projections (the largest ρ)."""
  med = lambda key, sel: float(np.median([r[key] for r in sel]))
  gate = [r for r in rows if r["proj"] == "gate"]
  return {
    "rho": med("rho", rows),
    "rho_max": max(r["rho"] for r in rows),
    "dx_ratio": med("dx_ratio", rows),
    "dx_ratio_max": max(r["dx_ratio"] for r in rows),
    "dx_ratio_pred": med("dx_ratio_pred", rows),
    "ec_ratio": med("ec_ratio", rows),
    "dw_ratio": med("dw_ratio", rows),
    "gate_rho": med("rho", gate),
    "gate_dx_ratio": med("dx_ratio", gate),
    "gate_dx_ratio_pred": med("dx_ratio_pred", gate),
    "gate_ec_ratio": med("ec_ratio", gate),
  }


def scale_config(study: ScaleStudy, spec: tuple, vocab_size: int) -> s3r_model.ModelConfig:
  """The model of one SCALE_MODELS entry."""
  _, d, layers, heads, kv, ff, _ = spec
  return s3r_model.ModelConfig(
    vocab_size=vocab_size,
    d_model=d,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=kv,
    d_ff=ff,
    max_seq_len=study.seq,
    recipe=study.recipe,
  )


def train_visiting(study: ScaleStudy, cfg: s3r_model.ModelConfig, corpus, at: list[int], visit) -> None:
  """Trains `cfg` as the study does and calls visit(step, params, last train loss) at each step of `at`."""
  opt = OptimizerConfig(lr=study.lr, total_steps=study.steps, warmup_steps=min(10, study.steps))
  tx = make_optimizer(opt)
  init_key, train_key = jax.random.split(jax.random.key(study.seed))
  state = init_state(s3r_model.init_params(cfg, init_key), tx)
  step_fn = jax.jit(make_train_step(s3r_model.graphdef(cfg), tx, schedule(opt)))
  loader = s3r_data.BatchLoader(corpus.train_tokens, batch_size=study.batch, seq_len=study.seq, seed=study.seed)
  loss = None
  for step in range(max(at) + 1):
    if step in at:
      visit(step, state.params, loss)
    if step < max(at):
      state, metrics = step_fn(state, loader.next(), train_key)
      loss = float(metrics["loss"])


def study_data(study: ScaleStudy, log=print):
  """(corpus, the one validation batch every measurement uses)."""
  corpus = s3r_data.prepare(study.data, vocab_size=study.vocab, cache_dir=study.cache_dir, log=log)
  batch_val = next(
    s3r_data.eval_batches(corpus.val_tokens["val"], batch_size=study.batch, seq_len=study.seq, max_batches=1)
  )
  return corpus, batch_val


def scale_study(study: ScaleStudy, results: dict, save, *, models=SCALE_MODELS, log=print) -> None:
  corpus, batch_val = study_data(study, log=log)
  for spec in models:
    name, d, layers, *_, tokens = spec
    todo = [s for s in study.measure_at if f"{name}@{s}" not in results["entries"]]
    if not todo:
      continue
    cfg = scale_config(study, spec, corpus.tokenizer.vocab_size)
    t0 = time.time()

    def visit(step, params, loss, name=name, d=d, layers=layers, tokens=tokens, cfg=cfg, t0=t0):
      rows = measure(cfg, params, batch_val, tokens=tokens)
      results["entries"][f"{name}@{step}"] = {
        "study": "scale",
        "model": name,
        "d_model": d,
        "n_layers": layers,
        "step": step,
        "train_loss": loss,
        "summary": _summarize(rows),
        "projections": rows,
      }
      save()
      log(f"{name} step {step}: {_summarize(rows)} ({time.time() - t0:.0f}s)")

    train_visiting(study, cfg, corpus, todo, visit)


def checkpoint_study(paths: list[str], results: dict, save, *, tokens: int = 256, n_keys: int = 4, log=print) -> None:
  """Measures every checkpoint of each run folder in `paths` (read-only) on a batch of enwiki shard 9
  encoded with the run's own tokenizer: the local errors per projection and, with the `python -m research diagnose`
  machinery (research.gradients, `n_keys` keys), the errors propagated to the block inputs."""
  from s3r.train.config import TrainConfig
  from s3r.train.evaluate import checkpoint_tokenizer
  from s3r.train.loop import build, make_mesh
  from s3r.train.run import checkpoint

  for path in paths:
    directory = checkpoint.find_checkpoint_dir(path)
    ckpt = checkpoint.Checkpointer(directory, create=False)
    for step in ckpt.all_steps():
      key = f"{pathlib.Path(path).name}@{step}"
      if key in results["entries"]:
        continue
      meta = ckpt.read_meta(step)
      cfg = dataclasses.replace(TrainConfig.from_dict(meta["train_config"]), mesh=None)
      tok = checkpoint_tokenizer(meta)
      setup = build(cfg, tok.vocab_size, make_mesh(cfg))
      state, _ = ckpt.restore(setup.abstract_state, step)
      batch = _shard9_batch(tok, cfg.batch, cfg.seq_len)
      rows = measure(setup.model_cfg, state.params, batch, tokens=tokens)
      e2e = gradients.relative_errors(
        setup.model_cfg, state.params, jnp.asarray(batch), RECIPES, n_keys=n_keys, log=log
      )
      results["entries"][key] = {
        "end_to_end": e2e,
        "study": "checkpoints",
        "model": cfg.preset,
        "run": pathlib.Path(path).name,
        "recipe": cfg.recipe.name,
        "lr": cfg.lr,
        "d_model": setup.model_cfg.d_model,
        "n_layers": setup.model_cfg.n_layers,
        "step": step,
        "summary": _summarize(rows),
        "projections": rows,
      }
      save()
      log(f"{key}: {_summarize(rows)}")
    ckpt.close()


def _shard9_batch(tok, batch: int, seq: int) -> np.ndarray:
  root = s3r_data.default_data_root()
  assert root is not None, "no data root: the enwiki shards are needed"
  shard = sorted((root / "enwiki").glob("*.jsonl.gz"))[-1]
  docs = []
  for doc in s3r_data.read_documents(str(shard)):
    docs.append(doc)
    if sum(map(len, docs)) > 40 * batch * seq:
      break
  ids = np.concatenate([np.asarray(x + [tok.eot_id], np.int32) for x in tok.encode_batch(docs)])
  return next(s3r_data.eval_batches(ids, batch_size=batch, seq_len=seq, max_batches=1))


# --- output ---------------------------------------------------------------------------------------


def _markdown(results: dict) -> str:
  lines = [
    "# Proposition 1 per projection: common row component vs the extra dX error of per-token sharing",
    "",
    provenance.metadata_lines(results["meta"], {}),
    f"Status: {'complete' if results.get('complete') else 'PARTIAL (the study was still running)'}.",
    "",
    "Exact local errors of each block projection (module docstring of research/mechanism.py); "
    "medians over the projections of each model. ratio = s3r / int8_sr relative dX error; "
    "predicted = sqrt((1 + ρ) / 2) from the evenly-spread-residual moments.",
    "",
    "| entry | d_model | layers | step | median ρ (all) | median ratio (all) | gate ρ | gate ratio | gate predicted "
    "| gate token-centred / SR | max ρ | max ratio | dW ratio |",
    "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
  ]
  for key, e in results["entries"].items():
    s = _summarize(e["projections"])
    lines.append(
      f"| {key} | {e['d_model']} | {e['n_layers']} | {e['step']} | {s['rho']:.2f} | {s['dx_ratio']:.3f} | "
      f"{s['gate_rho']:.2f} | {s['gate_dx_ratio']:.3f} | {s['gate_dx_ratio_pred']:.3f} | "
      f"{s['gate_ec_ratio']:.3f} | {s['rho_max']:.1f} | {s['dx_ratio_max']:.3f} | {s['dw_ratio']:.4f} |"
    )
    if "end_to_end" in e:
      ee = e["end_to_end"]
      lines.append(
        f"|  ↳ propagated (python -m research diagnose, {key}) | | | | | dX block 0 input s3r/int8_sr "
        f"{ee['s3r']['dx_first'] / ee['int8_sr']['dx_first']:.3f} | | last block input "
        f"{ee['s3r']['dx_last'] / ee['int8_sr']['dx_last']:.3f} | | s3r_ec_dx/int8_sr "
        f"{ee['s3r_ec_dx']['dx_first'] / ee['int8_sr']['dx_first']:.3f} | | | |"
      )
  rows = [r for e in results["entries"].values() for r in e["projections"]]
  if rows:
    meas, pred = np.array([r["dx_ratio"] for r in rows]), np.array([r["dx_ratio_pred"] for r in rows])
    lines += [
      "",
      f"All {len(rows)} projections: correlation of measured and predicted ratio "
      f"{np.corrcoef(meas, pred)[0, 1]:.3f}; median measured / predicted {np.median(meas / pred):.3f} "
      f"(IQR {np.percentile(meas / pred, 25):.3f}-{np.percentile(meas / pred, 75):.3f}); "
      f"max ρ {max(r['rho'] for r in rows):.2f}; max measured ratio {meas.max():.3f}.",
    ]
  return "\n".join(lines) + "\n"


def _plot(results: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
  for key, e in results["entries"].items():
    rho = [r["rho"] for r in e["projections"]]
    ax1.scatter(rho, [r["dx_ratio"] for r in e["projections"]], s=10, label=key)
    ax2.scatter([r["dx_ratio_pred"] for r in e["projections"]], [r["dx_ratio"] for r in e["projections"]], s=10)
  grid = np.linspace(0, max([r["rho"] for e in results["entries"].values() for r in e["projections"]] + [2]), 100)
  ax1.plot(grid, np.sqrt((1 + grid) / 2), "k--", label="sqrt((1+ρ)/2)")
  ax1.set_xlabel("ρ = Σ(Ŵ_i 1)² / Σ||Ŵ_i||²")
  ax1.set_ylabel("dX error, s3r / int8_sr")
  ax1.legend(fontsize=6, ncol=2)
  lim = [0.5, max(2.0, ax2.get_xlim()[1], ax2.get_ylim()[1])]
  ax2.plot(lim, lim, "k--")
  ax2.set_xlabel("predicted ratio sqrt((1+ρ)/2)")
  ax2.set_ylabel("measured ratio")
  fig.suptitle("Per-projection dX error of per-token sharing against Prop. 1's common row component")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def open_results(stem: str) -> tuple[pathlib.Path, pathlib.Path, dict]:
  """(output stem, its .json, the results so far: a resumed study skips the entries it has)."""
  out = pathlib.Path(stem)
  out.parent.mkdir(parents=True, exist_ok=True)
  path = out.with_suffix(".json")
  return out, path, json.loads(path.read_text()) if path.is_file() else {"entries": {}}


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(prog="python -m research.mechanism", description=__doc__.split("\n")[0])
  p.add_argument("--out", default="runs/results/mechanism")
  p.add_argument("--study", choices=("scale", "checkpoints", "both"), default="both")
  p.add_argument("--checkpoints", nargs="*", default=[], help="run folders whose checkpoints are measured")
  p.add_argument("--steps", type=int, default=ScaleStudy.steps)
  p.add_argument("--measure-at", default=",".join(map(str, ScaleStudy.measure_at)))
  p.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the .json")
  p.add_argument("--models", default=",".join(m[0] for m in SCALE_MODELS), help="subset of SCALE_MODELS")
  args = p.parse_args(argv)
  out, path, results = open_results(args.out)
  if args.report_only:
    out.with_suffix(".md").write_text(_markdown(results))
    _plot(results, out.with_suffix(".png"))
    return results
  results.update(meta=provenance.run_metadata(argv), complete=False)

  def save():
    provenance.write_json(path, results)
    out.with_suffix(".md").write_text(_markdown(results))

  by_name = {m[0]: m for m in SCALE_MODELS}
  models = tuple(by_name[name] for name in args.models.split(","))  # in the order given
  if args.study in ("checkpoints", "both") and args.checkpoints:
    checkpoint_study(args.checkpoints, results, save)
  if args.study in ("scale", "both"):
    study = ScaleStudy(steps=args.steps, measure_at=tuple(int(s) for s in args.measure_at.split(",")))
    scale_study(study, results, save, models=models)
  results["complete"] = True
  save()
  _plot(results, out.with_suffix(".png"))
  print(out.with_suffix(".md").read_text())
  return results


if __name__ == "__main__":
  main()
