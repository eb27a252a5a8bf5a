"""Three kernels written the way real libraries write their `@triton.autotune` kernels, shipped
pre-tuned by flytune-build:

- `scale_rows`: configs with a `pre_hook` that sets the block shape of host-side TMA descriptors (as
  Liger's kernels and Triton's persistent-matmul tutorial do); kept as `@triton.autotune`, adopted;
- `add_bias`: `@triton.heuristics` over `@triton.autotune` with an optional tensor argument and fla's
  `**autotune_cache_kwargs`; adopted through the Heuristics object the module exports;
- `matmul`: ported to `flytune_build.autotune`, with `prune_configs_by` (an early prune, a perf model,
  `top_k`) and `ACTIVATION` passed by keyword, as in Triton's 03-matrix-multiplication tutorial.

With TRITON_FEATURES_STOCK=1 every kernel is plain `@triton.autotune` and nothing is adopted: the
baseline `benchmarks/h200_features.py first-call` compares against.
"""
import inspect
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import flytune_build
import flytune_build.triton
from flytune_build import Config

STOCK = os.environ.get("TRITON_FEATURES_STOCK") == "1"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def where():
    return "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"


def _wall_clock_bench(fn, quantiles=None):  # Triton's own benchmarker needs a GPU driver
    import time

    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return [min(times)] * 3


STOCK_BENCH = {"do_bench": _wall_clock_bench} if INTERPRETED else {}  # stock kernels under the interpreter
supports_autotune_cache = "cache_results" in inspect.signature(triton.autotune).parameters
autotune_cache_kwargs = {"cache_results": True} if supports_autotune_cache else {}  # fla's idiom


# -- 1. a pre_hook preparing launch state: TMA descriptors whose block shape follows the config -----------
def _set_block_shape(nargs):
    block = [nargs["BLOCK_M"], nargs["BLOCK_N"]]
    nargs["x_desc"].block_shape = block
    nargs["y_desc"].block_shape = block


SCALE_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, pre_hook=_set_block_shape)
                 for m in (32, 64, 128) for n in (64, 128) for w in (4, 8)]


@triton.autotune(SCALE_CONFIGS, key=["M", "N"], **(STOCK_BENCH if STOCK else {}))
@triton.jit
def scale_rows_kernel(x_desc, y_desc, s, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    om, on = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    rows = om + tl.arange(0, BLOCK_M)
    scale = tl.load(s + rows, mask=rows < M, other=0.0)
    x = x_desc.load([om, on])
    y_desc.store([om, on], (x.to(tl.float32) * scale[:, None]).to(x.dtype))


def scale_rows(x, s):
    """y[i, :] = x[i, :] * s[i]."""
    M, N = x.shape
    y = torch.empty_like(x)
    x_desc, y_desc = TensorDescriptor.from_tensor(x, [32, 64]), TensorDescriptor.from_tensor(y, [32, 64])
    scale_rows_kernel[lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"]))](x_desc, y_desc, s, M, N)
    return y


def _validate_scale_rows(key):
    x = torch.randn(key["M"], key["N"]).to(where(), torch.float16)
    s = torch.randn(key["M"]).to(where(), getattr(torch, key["s"]))
    torch.testing.assert_close(scale_rows(x, s).float(), x.float() * s.float()[:, None], atol=1e-2, rtol=1e-2)


# -- 2. @triton.heuristics over @triton.autotune, an optional tensor argument ----------------------------
@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None})
@triton.autotune([triton.Config({"BLOCK": b}, num_warps=w) for b in (1024, 2048, 4096, 8192) for w in (4, 8, 16)],
                 key=["n"], **autotune_cache_kwargs, **(STOCK_BENCH if STOCK else {}))
@triton.jit
def add_bias_kernel(x, bias, out, n, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    if HAS_BIAS:
        v += tl.load(bias + offs, mask=m)
    tl.store(out + offs, v, mask=m)


def add_bias(x, bias=None):
    out = torch.empty_like(x)
    n = x.numel()
    add_bias_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, bias, out, n)
    return out


def _validate_add_bias(key):
    dtype = getattr(torch, key["x"])
    x = torch.randn(key["n"]).to(where(), dtype)
    bias = None if key["bias"] is None else torch.randn(key["n"]).to(where(), dtype)
    torch.testing.assert_close(add_bias(x, bias), x if bias is None else x + bias)


# -- 3. prune_configs_by: early prune, perf model, top_k; ACTIVATION by keyword ---------------------------
MATMUL_CONFIGS = [Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
                  for bm, bn, bk, s, w in ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
                                           (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
                                           (64, 32, 32, 5, 2), (32, 64, 32, 5, 2), (128, 128, 64, 3, 8),
                                           (64, 64, 64, 4, 4))]


def _fits(configs, named_args, **kwargs):
    """early_config_prune: no tile larger than the problem."""
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return [c for c in configs if c.kwargs["BLOCK_M"] <= M and c.kwargs["BLOCK_N"] <= N
            and c.kwargs["BLOCK_K"] <= K] or configs[-1:]


def _estimate_ms(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, **kwargs):
    """A rough roofline of an H200 (132 SMs, ~990 TFLOP/s fp16, ~4.8 TB/s): waves of tiles, each
    compute- or load-bound, with a pipelining discount for deeper stages."""
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    waves = triton.cdiv(tiles, 132)
    flops = 2.0 * BLOCK_M * BLOCK_N * K / (990e12 / 132)
    loads = 2.0 * (BLOCK_M + BLOCK_N) * K / (4.8e12 / 132)
    return waves * max(flops, loads) * 1e3 * (1.0 + 1.0 / num_stages)


@triton.jit
def _matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ACTIVATION: tl.constexpr):
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        av = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        bv = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(av, bv, acc)
    if ACTIVATION == "leaky_relu":
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _validate_matmul(key):
    dtype = getattr(torch, key["a"])
    a, b = torch.randn(key["M"], key["K"]).to(where(), dtype), torch.randn(key["K"], key["N"]).to(where(), dtype)
    ref = torch.nn.functional.leaky_relu(a.float() @ b.float(), 0.01)
    torch.testing.assert_close(matmul(a, b).float(), ref, atol=5e-2 * key["K"] ** 0.5, rtol=1e-2)


PRUNE = {"early_config_prune": _fits, "perf_model": _estimate_ms, "top_k": 3}
if STOCK:
    matmul_kernel = triton.autotune([triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
                                     for c in MATMUL_CONFIGS], key=["M", "N", "K"], prune_configs_by=PRUNE,
                                    **STOCK_BENCH)(_matmul_kernel)
else:
    matmul_kernel = flytune_build.autotune(MATMUL_CONFIGS, key=["a", "M", "N", "K"], prune_configs_by=PRUNE,
                                           name="triton_features.matmul", validate=_validate_matmul)(_matmul_kernel)


def matmul(a, b, activation="leaky_relu"):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), ACTIVATION=activation)
    return c


if not STOCK:
    flytune_build.triton.adopt(scale_rows_kernel, name="triton_features.scale_rows", validate=_validate_scale_rows)
    flytune_build.triton.adopt(add_bias_kernel, name="triton_features.add_bias", validate=_validate_add_bias)
