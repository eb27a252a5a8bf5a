"""Real Triton kernels for the runtime tests (run under TRITON_INTERPRET=1)."""
import triton
import triton.language as tl

import flytune_build as ft
from flytune_build import Config, nearest, pow2

ADD_CONFIGS = [Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


@triton.jit
def _add(x, y, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def _iadd(x, y, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def _accumulate(x, total, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total, tl.sum(tl.load(x + offs, mask=offs < n, other=0.0)))


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def make_add(name, key=("x", "n"), **kw):
    return ft.autotune(ADD_CONFIGS, list(key), name=name, **kw)(_add)


def make_iadd(name, **kw):
    return ft.autotune(ADD_CONFIGS, ["n"], name=name, restore_value=["x"], **kw)(_iadd)


def make_accumulate(name, **kw):
    return ft.autotune(ADD_CONFIGS, ["n"], name=name, reset_to_zero=["total"], **kw)(_accumulate)


__all__ = ["make_add", "make_iadd", "make_accumulate", "grid", "ADD_CONFIGS", "pow2", "nearest"]
