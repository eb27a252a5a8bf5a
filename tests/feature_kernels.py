"""Kernels written the way real libraries write their `@triton.autotune` kernels, for
tests/test_triton_features.py (run under TRITON_INTERPRET=1). Each factory returns a fresh kernel:
a Triton Autotuner keeps its cache on the object."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import flytune_build as ft

BLOCKS = (16, 32, 64)
HOOK_CALLS: list = []   # the BLOCK of every pre_hook call, in order


# -- a pre_hook that prepares launch state: TMA-style descriptors whose block shape follows the config --
def set_descriptor_blocks(nargs):
    """Without this, a descriptor keeps the block shape it was made with, and a config with another
    BLOCK silently computes the wrong thing."""
    HOOK_CALLS.append(nargs["BLOCK"])
    nargs["x_desc"].block_shape = [nargs["BLOCK"]]
    nargs["y_desc"].block_shape = [nargs["BLOCK"]]


def hooked_configs():
    return [triton.Config({"BLOCK": b}, pre_hook=set_descriptor_blocks) for b in BLOCKS]


@triton.jit
def _scale_desc(x_desc, y_desc, n, alpha, BLOCK: tl.constexpr):
    off = tl.program_id(0) * BLOCK
    y_desc.store([off], x_desc.load([off]) * alpha)


def descriptors(n, dtype=torch.float32):
    """x, y and their descriptors, made with a block shape no config uses."""
    x, y = torch.randn(n, dtype=dtype), torch.zeros(n, dtype=dtype)
    return x, y, TensorDescriptor.from_tensor(x, [8]), TensorDescriptor.from_tensor(y, [8])


def scale(k, n, alpha=2.0):
    x, y, xd, yd = descriptors(n)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](xd, yd, n, alpha)
    return torch.allclose(y, x * alpha)


def ported_scale(name, **kw):
    return ft.autotune(hooked_configs(), key=["n"], name=name, **kw)(_scale_desc)


def triton_scale(**kw):
    return triton.autotune(hooked_configs(), key=["n"], **kw)(_scale_desc)


# -- @triton.heuristics over @triton.autotune, an optional tensor argument (fla's layout) ----------------
@triton.jit
def _add_bias(x, bias, out, n, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    if HAS_BIAS:
        v += tl.load(bias + offs, mask=m)
    tl.store(out + offs, v, mask=m)


def add_bias_kernel(**kw):
    tuner = triton.autotune([triton.Config({"BLOCK": b}, num_warps=w) for b in BLOCKS for w in (1, 2)],
                            key=["n"], **kw)(_add_bias)
    return triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None})(tuner)


def add_bias(k, n, with_bias, dtype=torch.float32):
    x, out = torch.randn(n, dtype=dtype), torch.empty(n, dtype=dtype)
    bias = torch.randn(n, dtype=dtype) if with_bias else None
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, bias, out, n)
    return torch.equal(out, x + bias if with_bias else x)


# -- prune_configs_by with a perf model, keyword arguments after tuned constexprs (tutorial 03's layout) --
@triton.jit
def _matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, ACTIVATION: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        av = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.)
        bv = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.)
        acc += tl.dot(av, bv)
    if ACTIVATION == "relu":
        acc = tl.maximum(acc, 0.0)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


MATMUL_CONFIGS = [ft.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=4)
                  for m in (16, 32) for n in (16, 32) for k in (16, 32)]
SEEN: dict = {"perf_model": [], "early_config_prune": []}


def estimate_ms(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, ACTIVATION, **_):
    """A perf model in Triton's style: every argument, every config kwarg, by keyword."""
    SEEN["perf_model"].append((BLOCK_M, BLOCK_N, BLOCK_K, ACTIVATION))
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    return tiles * triton.cdiv(K, BLOCK_K) + 0.01 * BLOCK_K


def drop_deep_k(configs, named_args, **kwargs):
    SEEN["early_config_prune"].append((sorted(named_args), sorted(kwargs), type(configs[0]).__name__))
    return [c for c in configs if c.kwargs["BLOCK_K"] <= named_args["K"]]


def ported_matmul(name, top_k=2, key=("M", "N", "K", "ACTIVATION"), **kw):
    return ft.autotune(MATMUL_CONFIGS, key=list(key), name=name,
                       prune_configs_by={"perf_model": estimate_ms, "top_k": top_k,
                                         "early_config_prune": drop_deep_k}, **kw)(_matmul)


def matmul(k, M=32, N=32, K=16, activation="relu"):
    g = torch.Generator().manual_seed(M * N + K)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    c = torch.empty(M, N)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
    k[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            ACTIVATION=activation)  # passed by keyword, after the tuned constexprs
    ref = a @ b
    return torch.allclose(c, ref.relu() if activation == "relu" else ref, atol=1e-2, rtol=1e-2)


# -- reset_to_zero: an atomic accumulation that every candidate must start from zero -------------------
@triton.jit
def _total(x, total, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total, tl.sum(tl.load(x + offs, mask=offs < n, other=0.0)))


def triton_total(**kw):
    return triton.autotune([triton.Config({"BLOCK": b}) for b in BLOCKS], key=["n"], reset_to_zero=["total"],
                           **kw)(_total)


def total(k, n):
    x, t = torch.arange(n, dtype=torch.float32), torch.zeros(1)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, t, n)
    return t.item() == float(sum(range(n)))


# -- a pruner that attaches a pre_hook (gemlite's split-K pruner adds `init_to_zero` to what it returns) --
def _zero_total(nargs):
    nargs["total"].zero_()


def hooking_prune(configs, nargs, **kwargs):
    """The declared configs carry no hook: the ones this returns zero the accumulator before launching."""
    return [triton.Config(dict(c.kwargs), num_warps=c.num_warps, pre_hook=_zero_total) for c in configs]


def pruned_total(decorator, **kw):
    return decorator([triton.Config({"BLOCK": b}) for b in BLOCKS], key=["n"],
                     prune_configs_by={"early_config_prune": hooking_prune}, **kw)(_total)


def dirty_total(k, n):
    """`total` full of garbage: only the pruner's hook makes the sum right."""
    x, t = torch.arange(n, dtype=torch.float32), torch.full((1,), 1e6)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, t, n)
    return t.item() == float(sum(range(n)))
