"""Triton's decorator wrappers, walked one way: `@triton.heuristics`, `@triton.autotune` and ours each hold
the function they wrap as `.fn`, down to the `@triton.jit` function and its Python function."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

DEPTH = 16  # wrappers followed at most: a chain this deep is no kernel's, and a cycle must end


def chain(obj: Any) -> Iterator[Any]:
    """`obj`, then what it wraps (`.fn`), and so on: at most DEPTH objects, ending before a None."""
    for _ in range(DEPTH):
        if obj is None:
            return
        yield obj
        obj = getattr(obj, "fn", None)


def heuristic_names(fn: Any) -> set[str]:
    """The parameters `@triton.heuristics` wrappers around `fn` set (the caller never passes them): each
    wrapper's `values`, down to the first `@triton.jit` function under `fn`."""
    out: set = set()
    for o in chain(fn):
        if o is not fn and type(o).__name__ in ("JITFunction", "InterpretedFunction") and hasattr(o, "arg_names"):
            break
        values = getattr(o, "values", None)
        if isinstance(values, dict):
            out |= set(values)
    return out
