import sys, numpy as np, jax, jax.numpy as jnp
from jax import lax
from s3r.bench import ffn, common
from s3r.quant import ec

orig = ec.error_factors
def gemv_factors(e_BxSxN):
    b, s, n = e_BxSxN.shape
    r = jnp.mean(e_BxSxN, axis=2)
    ones = jnp.ones((b, 1, s), jnp.float32)
    c = jnp.einsum("bos,bsn->bon", ones, e_BxSxN, precision=lax.Precision.HIGHEST)[:, 0] * (1.0 / s)
    return r, c, jnp.mean(r, axis=1)

for shape in sys.argv[1].split(","):
    H, D = common.SHAPES[shape]; T = 2048 if shape in ("W1","W2","W3") else 1024
    args = ffn.make_inputs(T, H, D)
    cfg = {}
    for name, recipe, fac in [("int8_rtne", "int8_rtne", orig), ("s3r", "s3r", orig),
                              ("ec_dx", "s3r_ec_dx", orig), ("ec_dx_gemv", "s3r_ec_dx", gemv_factors)]:
        ec.error_factors = fac
        cfg[name] = (ffn.make_fwd_bwd(recipe).lower(*args).compile(), args)
    ec.error_factors = orig
    out = common.time_interleaved(cfg, repeats=int(sys.argv[2]), warmup=1)
    med = {k: np.median(t.samples) for k, t in out.items()}
    print(shape, " ".join(f"{k}={v*1e3:.1f}ms({v/med['int8_rtne']:.3f})" for k, v in med.items()), flush=True)
