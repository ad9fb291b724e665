"""Keeping a run alive and recording it: what the loop does around the step.

`checkpoint.py` (Orbax checkpoints of the state and the loader's position), `resume.py` (which run a
folder holds, and what a resumed run must match), `recovery.py` (the checkpoint known to be good, the
messages of a stopped run), `guard.py` (one training per folder, Ctrl-C, divergence), `peers.py` (the
processes of a multi-process run watching each other), `placement.py` (what each process loads),
`compile_cache.py` (JAX's persistent compilation cache), `logs.py` (the libraries' logs into
train.log), `report.py` (metrics.jsonl, the loss curve), `tracking.py` (TensorBoard, Weights & Biases)
and `profiling.py` (profiler traces of chosen steps).
"""
