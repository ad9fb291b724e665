"""What `benchmarks/` and `research/` share, run from a checkout and never installed: results files with
their provenance (`results.py`), the paper's reference numbers (`paper.py`), the lockstep train step's
configuration (`lockstep.py`) and program analysis (`analysis/`: the jaxpr and HLO readers the tests use
too). It imports the library; the library never imports it."""
