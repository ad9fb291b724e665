"""Training: optimizer, pure train/eval steps, sharding rules, checkpoints and the I/O loop.

    from s3r.train import TrainConfig, train
    summary = train(TrainConfig(preset="tiny", steps=20, out="runs/tiny"))

`train` is what `s3r train` runs (`s3r.train.loop`); the pure pieces (`make_train_step`,
`init_state`, `make_optimizer`) compose into a loop of one's own.

Two rooms: `step/`, the pure step (train and eval steps, the optimizer, the sharding rules), and
`run/`, what keeps a run alive and records it (checkpoints, resume and recovery, the guard against
divergence and interrupts, the processes of a multi-process run, logs, metrics, trackers, profiles).
Beside them: the run's config (`config.py`), its compiled pieces (`builder.py`, `attention.py`), the
loop (`loop.py`), evaluation (`evaluate.py`), export (`export.py`) and FLOP counts (`flops.py`).
"""

from s3r.train.builder import ResourceError, Setup, build, make_mesh, prepare_data
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.evaluate import evaluate_checkpoint, open_run
from s3r.train.loop import train
from s3r.train.run.guard import TrainingDiverged, TrainingInterrupted
from s3r.train.step import TrainState, cross_entropy, init_state, make_eval_step, make_train_step
from s3r.train.step.optimizer import OptimizerConfig, make_optimizer, schedule

__all__ = [
  "ConfigError",
  "OptimizerConfig",
  "ResourceError",
  "Setup",
  "TrainConfig",
  "TrainState",
  "TrainingDiverged",
  "TrainingInterrupted",
  "build",
  "cross_entropy",
  "evaluate_checkpoint",
  "init_state",
  "make_eval_step",
  "make_mesh",
  "make_optimizer",
  "make_train_step",
  "open_run",
  "prepare_data",
  "schedule",
  "train",
]
