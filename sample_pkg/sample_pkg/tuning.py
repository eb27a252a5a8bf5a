"""Tuning-plan setups: each builds inputs for one shape and returns the call to tune."""
import os

import torch

import sample_pkg


def _device():
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return "cpu" if interpreted or not torch.cuda.is_available() else "cuda"


def _dtype(name):
    return getattr(torch, name)


def rmsnorm(M, N, dtype="float16"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, N, generator=gen, dtype=torch.float32).to(_device(), _dtype(dtype))
    w = torch.randn(N, generator=gen, dtype=torch.float32).to(_device(), _dtype(dtype))
    return lambda: sample_pkg.rmsnorm(x, w)


def softmax(M, N, dtype="float16"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, N, generator=gen, dtype=torch.float32).to(_device(), _dtype(dtype))
    return lambda: sample_pkg.softmax(x)


def matmul(M, N, K, dtype="float16"):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen, dtype=torch.float32).to(_device(), _dtype(dtype))
    b = torch.randn(K, N, generator=gen, dtype=torch.float32).to(_device(), _dtype(dtype))
    return lambda: sample_pkg.matmul(a, b)
