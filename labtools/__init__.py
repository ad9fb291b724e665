"""What `benchmarks/` and `research/` share, run from a checkout and never installed: results files with
their provenance (`results.py`), the paper's reference numbers (`paper.py`) and the lockstep train step's
configuration (`lockstep.py`). It imports the library; the library never imports it."""
