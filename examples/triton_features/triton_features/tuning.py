"""Tuning-plan setups: each builds the inputs of one shape and returns the call to tune (or to serve)."""
import torch

from . import kernels


def _randn(*shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g).to(kernels.where(), getattr(torch, dtype))


def scale_rows(M, N, dtype="float16"):
    x, s = _randn(M, N, dtype=dtype), _randn(M, dtype="float32")
    return lambda: kernels.scale_rows(x, s)


def add_bias(n, bias, dtype="float32"):
    x = _randn(n, dtype=dtype)
    b = _randn(n, dtype=dtype) if bias else None
    return lambda: kernels.add_bias(x, b)


def matmul(M, N, K, dtype="float16"):
    a, b = _randn(M, K, dtype=dtype), _randn(K, N, dtype=dtype)
    return lambda: kernels.matmul(a, b)
