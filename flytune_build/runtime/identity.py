"""What a searched winner depends on, and what an artifact records about how it was found.

`toolchain` and `scratch_key` address a winner in the scratch cache: any change to the kernel source,
the tool versions, the compiler-relevant environment, the tensors' layout, the device or the config
space is another key, so a stale winner is never served. `provenance` is the one record of how a
winner was found, for our searches and for `@triton.autotune` recordings alike; it is kept out of an
artifact's identity (its content address).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core import settings
from ..core.key import dtype_name
from ..core.version import VERSION
from .serving.scratch import entry_key


@functools.cache
def versions() -> dict:
    """The versions of flytune, Triton, torch and its CUDA or HIP."""
    import torch
    import triton

    return {"flytune": VERSION, "triton": triton.__version__, "torch": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None)}


@functools.cache
def toolchain(fn: Callable) -> dict:
    """`versions()` plus the hash of `fn`'s source and the environment that changes compiled code (once per `fn`)."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = fn.__qualname__
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
        env = dict(sorted(get_cache_invalidating_env_vars().items()))
    except Exception:
        env = settings.triton_env()
    return {**versions(), "source": hashlib.sha256(src.encode()).hexdigest(), "env": env}


def scratch_key(kernel: str, key: dict, bound: dict, arg_names: Sequence[str], device: Any, tools: dict,
                space: str) -> str:
    """The scratch-cache address of one call's winner; a tensor contributes its dtype and stride pattern."""
    layout = []
    for name in arg_names:
        v = bound.get(name)
        if hasattr(v, "stride") and hasattr(v, "dtype"):
            layout.append([name, dtype_name(v.dtype), [0 if s == 0 else 1 if s == 1 else 2 for s in v.stride()]])
    return entry_key({"kernel": kernel, "key": key, "layout": layout, "device": device.spec(),
                      "toolchain": tools, "space": space})


def provenance(candidates: Sequence[Any], space_hash: str, ranking: str, specialization: dict | None = None, *,
               measurement: dict | None = None, selection: dict | None = None, outputs: dict | None = None) -> dict:
    """How a winner was found: versions, when, over which config space, and every `bench.Candidate` timed;
    with how Triton specialised the winner's launch when known (`runtime.warming.binder`), how the times
    were taken (`bench.Measurement`), why the winner won (`selection`) and what its outputs were checked
    against (`outputs`)."""
    out = {**versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "space_hash": space_hash, "ranking": ranking, "candidates": [c.to_json() for c in candidates]}
    if specialization is not None:
        out["specialization"] = specialization
    if measurement is not None:
        out["measurement"] = measurement
    if selection is not None:
        out["selection"] = selection
    if outputs is not None:
        out["outputs"] = outputs
    return out
