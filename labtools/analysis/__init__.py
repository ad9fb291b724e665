"""Program analysis: what a traced or compiled JAX program really does, read without running it.

- `jaxpr`: one walker over nested jaxprs (jit, custom_vjp, scan, remat, cond); int8 GEMMs, random words.
- `hlo`: one parser of XLA's HLO text (computations, instructions, execution counts, buffers).
- `elementwise`: per-element operation counts and bytes written on arrays of a given size.
- `collectives`: the collectives of an SPMD-partitioned program and their byte counts.
- `buffers`: XLA's buffer-assignment dump parsed (allocations, and the values placed in them).
- `memory`: a compiled program's temporary memory, buffer by buffer (XLA's buffer assignment).
- `heap`: each temp allocation laid out over offset and program step.

Repository tooling (the tests, `benchmarks/`), not part of the installed library, which needs none of
it. It imports jax and numpy only (and the standard library), nothing of s3r.
"""
