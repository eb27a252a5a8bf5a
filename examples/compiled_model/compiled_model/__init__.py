"""A transformer block (layernorm, attention with softmax, MLP with a fused GELU) compiled by Inductor,
shipped with its Inductor autotune winners for an H200.

`block()` is the compile entry `flytune harvest compiled_model:block` records on the GPU (`mlp()`, an MLP
of three matmul shapes, a second one); `compiled()`
is how the package's users get the model compiled with the shipped winners.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# COMPILED_MODEL_SMALL=1: a block small enough for a CPU smoke run of benchmarks/inductor_compile.py
WIDTH, HEADS, FF, BATCH, SEQ = (64, 4, 128, 2, 32) if os.environ.get("COMPILED_MODEL_SMALL") else (1024, 16, 4096, 8, 1024)


class Block(nn.Module):
    def __init__(self, d: int = WIDTH, heads: int = HEADS, ff: int = FF):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = torch.softmax((q @ k.transpose(-1, -2)).float() * (d // h) ** -0.5, dim=-1).to(x.dtype)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MLP(nn.Module):
    """Three matmuls of three shapes (WIDTH -> MLP_WIDTHS[0] -> MLP_WIDTHS[1] -> WIDTH), SiLU and GELU."""

    def __init__(self, d: int = WIDTH, widths: tuple[int, int] = None):
        super().__init__()
        a, b = widths or MLP_WIDTHS
        self.up, self.mid, self.down = nn.Linear(d, a), nn.Linear(a, b), nn.Linear(b, d)

    def forward(self, x):
        return self.down(F.gelu(self.mid(F.silu(self.up(x)))))


MLP_WIDTHS = (96, 48) if os.environ.get("COMPILED_MODEL_SMALL") else (2816, 1536)


def block():
    """(model, example_inputs): the compile entry, on the GPU in bfloat16 (a CPU gets float32)."""
    torch.manual_seed(0)
    dev, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    model = Block().eval().requires_grad_(False).to(dev, dtype)
    return model, (torch.randn(BATCH, SEQ, WIDTH, device=dev, dtype=dtype),)


def mlp():
    """(model, example_inputs): a second compile entry, an MLP of three matmul shapes (bfloat16 on the GPU)."""
    torch.manual_seed(0)
    dev, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    model = MLP().eval().requires_grad_(False).to(dev, dtype)
    return model, (torch.randn(BATCH * SEQ // 2, WIDTH, device=dev, dtype=dtype),)


def compiled(model: nn.Module, **options):
    """`torch.compile(model)` served with this package's shipped winners on a matching device: its first
    call compiles with no Inductor autotune benchmarking for every kernel the bundle holds."""
    import flytune_build.inductor as fti

    serving = fti.serve(("compiled_model",))  # read once; opened around each call, where a compile may happen
    inner = torch.compile(model, **options)

    def call(*args, **kwargs):
        with serving:
            return inner(*args, **kwargs)
    return call
