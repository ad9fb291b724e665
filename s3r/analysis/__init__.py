"""Program analysis: what a traced or compiled JAX program really does, read without running it.

- `jaxpr`: one walker over nested jaxprs (jit, custom_vjp, scan, remat, cond); int8 GEMMs, random words.
- `hlo`: one parser of XLA's HLO text (computations, instructions, execution counts, buffers).
- `elementwise`: per-element operation counts and bytes written on arrays of a given size.
- `collectives`: the collectives of an SPMD-partitioned program and their byte counts.
- `memory`: a compiled program's temporary memory, buffer by buffer (XLA's buffer assignment).

A leaf of the package graph: it imports jax and numpy only (and the standard library).
"""
