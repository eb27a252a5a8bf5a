"""Triton kernels, each autotuned by flytune_build with a declared key and a heuristic default."""
import os

import torch
import triton
import triton.language as tl

import flytune_build as ft
from flytune_build import Config, pow2


def _next_pow2(n):
    return 1 << max(n - 1, 0).bit_length()


def _where():
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return "cpu" if interpreted or not torch.cuda.is_available() else "cuda"


# reference checks for `flytune verify --execute`: build inputs for a key, run, compare with torch
def _validate_rmsnorm(key):
    from sample_pkg import rmsnorm
    x = torch.randn(key["M"], key["N"]).to(_where(), getattr(torch, key["x"]))
    w = torch.randn(key["N"]).to(_where(), getattr(torch, key["x"]))
    ref = x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(rmsnorm(x, w).float(), ref, atol=2e-2, rtol=2e-2)


def _validate_softmax(key):
    from sample_pkg import softmax
    x = torch.randn(key["M"], key["N"]).to(_where(), getattr(torch, key["x"]))
    torch.testing.assert_close(softmax(x).float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=1e-2)


def _validate_matmul(key):
    from sample_pkg import matmul
    a = torch.randn(key["M"], key["K"]).to(_where(), getattr(torch, key["a"]))
    b = torch.randn(key["K"], key["N"]).to(_where(), getattr(torch, key["a"]))
    torch.testing.assert_close(matmul(a, b).float(), a.float() @ b.float(), atol=5e-2 * key["K"] ** 0.5, rtol=1e-2)


# -- RMSNorm forward ----------------------------------------------------------------------------
RMSNORM_CONFIGS = [Config({"BLOCK": b}, num_warps=w) for b in (256, 512, 1024, 2048, 4096) for w in (2, 4, 8, 16)]


def _rmsnorm_default(args):
    block = min(max(_next_pow2(args["N"]), 256), 4096)
    return Config({"BLOCK": block}, num_warps=8 if block >= 2048 else 4)


@ft.autotune(configs=RMSNORM_CONFIGS, key=["x", pow2("M"), "N"], default=_rmsnorm_default,
             validate=_validate_rmsnorm, name="sample_pkg.rmsnorm")
@triton.jit
def rmsnorm_kernel(x, w, y, M, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for o in range(0, N, BLOCK):
        v = tl.load(x + row * stride + o + offs, mask=o + offs < N, other=0.0).to(tl.float32)
        acc += v * v
    r = 1.0 / tl.sqrt(tl.sum(acc) / N + eps)
    for o in range(0, N, BLOCK):
        m = o + offs < N
        v = tl.load(x + row * stride + o + offs, mask=m, other=0.0).to(tl.float32)
        g = tl.load(w + o + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y + row * stride + o + offs, (v * r * g).to(y.dtype.element_ty), mask=m)


# -- row-wise softmax (online: any BLOCK covers any row length) -----------------------------------
SOFTMAX_CONFIGS = [Config({"BLOCK": b}, num_warps=w) for b in (256, 512, 1024, 2048) for w in (1, 2, 4, 8)]


def _softmax_default(args):
    return Config({"BLOCK": min(max(_next_pow2(args["N"]), 256), 2048)}, num_warps=4)


@ft.autotune(configs=SOFTMAX_CONFIGS, key=["x", pow2("M"), "N"], default=_softmax_default,
             validate=_validate_softmax, name="sample_pkg.softmax")
@triton.jit
def softmax_kernel(x, y, M, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m_i = tl.full((BLOCK,), -1.0e30, tl.float32)  # finite: masked lanes never produce inf - inf
    l_i = tl.zeros((BLOCK,), dtype=tl.float32)
    for o in range(0, N, BLOCK):
        msk = o + offs < N
        v = tl.where(msk, tl.load(x + row * stride + o + offs, mask=msk, other=0.0).to(tl.float32), -1.0e30)
        m_new = tl.maximum(m_i, v)
        l_i = l_i * tl.exp(m_i - m_new) + tl.where(msk, tl.exp(v - m_new), 0.0)
        m_i = m_new
    m = tl.max(m_i, 0)
    s = tl.sum(l_i * tl.exp(m_i - m), 0)
    for o in range(0, N, BLOCK):
        msk = o + offs < N
        v = tl.load(x + row * stride + o + offs, mask=msk, other=0.0).to(tl.float32)
        tl.store(y + row * stride + o + offs, (tl.exp(v - m) / s).to(y.dtype.element_ty), mask=msk)


# -- fp16 tiled matmul, grouped ordering -----------------------------------------------------------
MATMUL_CONFIGS = [
    Config({"BM": bm, "BN": bn, "BK": bk, "GM": 8}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [(128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                             (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 2, 5), (32, 64, 32, 2, 5),
                             (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (256, 64, 64, 4, 4), (64, 256, 64, 4, 4)]
]


def _matmul_default(args):
    big = args["M"] >= 1024 and args["N"] >= 1024
    return Config({"BM": 128, "BN": 128 if big else 64, "BK": 32, "GM": 8}, num_warps=4, num_stages=4)


@ft.autotune(configs=MATMUL_CONFIGS, key=["a", pow2("M"), "N", "K"], default=_matmul_default,
             validate=_validate_matmul, name="sample_pkg.matmul")
@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    npg = GM * npn
    gid = pid // npg
    fm = gid * GM
    gs = min(npm - fm, GM)
    pm = fm + ((pid % npg) % gs)
    pn = (pid % npg) // gs
    rm = (pm * BM + tl.arange(0, BM)) % M
    rn = (pn * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    ap = a + rm[:, None] * sam + rk[None, :] * sak
    bp = b + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        x = tl.load(ap, mask=rk[None, :] < K - k * BK, other=0.0)
        y = tl.load(bp, mask=rk[:, None] < K - k * BK, other=0.0)
        acc = tl.dot(x, y, acc)
        ap += BK * sak
        bp += BK * sbk
    cm = pm * BM + tl.arange(0, BM)
    cn = pn * BN + tl.arange(0, BN)
    tl.store(c + cm[:, None] * scm + cn[None, :] * scn, acc.to(tl.float16), mask=(cm[:, None] < M) & (cn[None, :] < N))
