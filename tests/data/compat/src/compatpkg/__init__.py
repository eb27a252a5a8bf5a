"""The compatibility corpus's package: a ported kernel and an fla-style adopted one.

Written against the API every release has (`flytune_build.autotune`, `flytune_build.triton.adopt`),
so the wheel the first release built imports and serves under every later one.
"""
import triton
import triton.language as tl

import flytune_build as ft
from flytune_build import Config


def wall_clock(fn, quantiles=None):
    """Triton's `do_bench` contract on the interpreter, which has no device to time."""
    import time

    t = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t) * 1e3
    return [ms, ms, ms] if quantiles else ms


@ft.autotune([Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)], ["x", "n"],
             default=lambda a: Config({"BLOCK": 16}), name="compatpkg.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


def add(x, y):
    out = x.new_empty(x.shape)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


# fla's chunk-global cumsum (fla/ops/utils/cumsum.py), cut down: @triton.heuristics over
# @triton.autotune, optional `cu_seqlens` and `scale` that callers pass as None.
@triton.heuristics({"IS_VARLEN": lambda a: a["cu_seqlens"] is not None,
                    "HAS_SCALE": lambda a: a["scale"] is not None})
@triton.autotune([triton.Config({"BT": bt}, num_warps=w) for bt in (16, 32) for w in (1, 2)],
                 key=["B", "H", "IS_VARLEN"], do_bench=wall_clock)
@triton.jit
def cumsum_kernel(s, o, cu_seqlens, scale, T, B: tl.constexpr, H: tl.constexpr, BT: tl.constexpr,
                  IS_VARLEN: tl.constexpr, HAS_SCALE: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    if IS_VARLEN:
        bos, eos = tl.load(cu_seqlens + i_b).to(tl.int32), tl.load(cu_seqlens + i_b + 1).to(tl.int32)
    else:
        bos, eos = i_b * T, i_b * T + T
    acc = tl.zeros([], dtype=tl.float32)
    for i_c in range(0, tl.cdiv(eos - bos, BT)):
        offs = bos + i_c * BT + tl.arange(0, BT)
        m = offs < eos
        x = tl.load(s + offs * H + i_h, mask=m, other=0).to(tl.float32)
        c = tl.cumsum(x, 0) + acc
        if HAS_SCALE:
            c = c * scale
        tl.store(o + offs * H + i_h, c.to(o.dtype.element_ty), mask=m)
        acc += tl.sum(x, 0)


def cumsum(s, cu_seqlens=None, scale=None):
    """Cumulative sum over time of `s` [B, T, H] (or [1, total, H] with `cu_seqlens`), fla's call."""
    B, T, H = s.shape
    n = B if cu_seqlens is None else len(cu_seqlens) - 1
    o = s.new_empty(s.shape)
    cumsum_kernel[(n * H,)](s, o, cu_seqlens, scale, T, B=n, H=H)
    return o
