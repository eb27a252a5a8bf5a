"""Swap sample_pkg's flytune kernels for `triton.autotune` over the same configs and key (the anchor)."""
import triton

from sample_pkg import kernels


def to_triton(cfg):
    return triton.Config(dict(cfg.kwargs), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                         num_ctas=cfg.num_ctas, maxnreg=cfg.maxnreg)


def swap():
    for attr in ("rmsnorm_kernel", "softmax_kernel", "matmul_kernel"):
        k = getattr(kernels, attr)
        setattr(kernels, attr, triton.autotune(configs=[to_triton(c) for c in k.configs],
                                               key=list(k.axis_names))(k.fn))
