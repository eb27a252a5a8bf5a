"""Copies of a search's tensor inputs at other device addresses, so that its timings sample where the
data lies as well as how long the kernel runs.

Why: on an H200 a few-microsecond kernel's time moves with the addresses of its inputs and from one
process to the next, more than it moves between repeats (`benchmarks/timing_bias.py`, 72 configs of
four small shapes: a median 4.4% across six placements in one process, up to 11%; 3.6% across three
processes at the same addresses, one config 106%; a median 1.4% between repeats). Timed on the
caller's tensors alone, a cold run screened out (+20.5%) the rmsnorm 256 x 1024 config that the next
run chose. A search that times each pass and round on another placement turns that per-process bias
into dispersion, which the tie band then sees (`selection`), instead of a ranking of one placement.

Invariants:
- placement 0 is the caller's own tensors; every other placement holds a copy of the bytes each device
  tensor argument spans, in a fresh allocation, at an address with the same remainder modulo 1 KiB
  (Triton specialises on 16-byte alignment: every placement runs the same compiled kernel);
- tensors that share storage share it in every placement (aliasing and views are kept), tensors in
  tuple arguments and a tensor descriptor's `base` included; memory reached only through addresses
  stored in the data (an int64 pointer table) stays where it is;
- what cannot be copied exactly (a tensor subclass, a non-strided layout, a tensor at an address its
  dtype cannot address, on ROCm a storage over 2 GiB), too many bytes (`LIMIT_BYTES`, or a quarter of
  the device's free memory), or a hook that reaches an argument other than through `nargs` (it would
  reset the caller's tensor while a copy is timed) leaves one placement, and `note` says why;
- copies are never written back: the caller's tensors are only ever placement 0.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any

ALIGN = 1024                # every copy keeps its original's address modulo 1 KiB
LIMIT_BYTES = 4 << 30       # at most 4 GiB of copies in all (and a quarter of the free device memory)


@dataclass
class Site:
    """One placement of the call: its arguments and its bound parameters (name -> value)."""
    args: tuple
    kwargs: dict
    bound: dict   # a copy's tensors are views of its allocations, which they keep alive


@dataclass
class Placements:
    sites: list[Site]
    note: str | None = None    # why there is only one placement, when there is

    def __len__(self) -> int:
        return len(self.sites)


def spread(args: tuple, kwargs: dict, bound: dict, count: int, hooks: tuple = ()) -> Placements:
    """`count` placements of this call (fewer, with a `note`, when its tensors cannot be copied).
    `hooks`: the search's pre/post hooks; one that reaches an argument's memory other than through
    `nargs` (a closure, a global) would reset the caller's tensor while a copy is timed."""
    own = Site(tuple(args), dict(kwargs), dict(bound))
    if count <= 1:
        return Placements([own])
    try:
        import torch
    except ImportError:
        return Placements([own], "no torch")
    tensors = _device_tensors(torch, [*args, *kwargs.values(), *bound.values()])
    if not tensors:
        return Placements([own], "no device tensor argument")
    groups, why = _groups(torch, tensors)
    if why:
        return Placements([own], why)
    if _hook_reaches(torch, hooks, groups):
        return Placements([own], "a hook refers to an argument's memory other than through nargs")
    total = sum(hi - lo for lo, hi, _ in groups.values())
    free = _free_bytes(torch, tensors[0].device)
    budget = min(LIMIT_BYTES, free // 4 if free is not None else LIMIT_BYTES)
    if total * (count - 1) > budget:
        return Placements([own], f"inputs of {total / 2**20:.1f} MiB: {count - 1} copies exceed "
                                 f"{budget / 2**20:.0f} MiB")
    sites = [own]
    try:
        with torch.no_grad():
            for _ in range(count - 1):
                sites.append(_copy(torch, own, groups))
    except Exception as e:  # noqa: BLE001 - out of memory, a driver refusal: time on the caller's tensors
        return Placements([own], f"copying the inputs failed: {type(e).__name__}: {e}"[:300])
    return Placements(sites)


def _placeable(t) -> bool:
    """A tensor this module places again: one on the GPU (a CUDA or ROCm device)."""
    return t.is_cuda


def members(torch, v, name: str = ""):
    """(label, tensor) for each tensor an argument named `name` holds: itself (`name`), a tuple's items
    (Triton's tuple arguments: `name[0]`), a tensor descriptor's `base` (`name.base`:
    triton.tools.tensor_descriptor.TensorDescriptor and the like). Placement and the output check
    (`outputs.start`) alike: what a kernel can write through is what each of them handles."""
    if isinstance(v, torch.Tensor):
        yield name, v
    elif isinstance(v, (tuple, list)):
        for i, item in enumerate(v):
            yield from members(torch, item, f"{name}[{i}]")
    elif dataclasses.is_dataclass(v) and not isinstance(v, type) and isinstance(getattr(v, "base", None), torch.Tensor):
        yield f"{name}.base", v.base


def _device_tensors(torch, values) -> list:
    seen, out = set(), []
    for v in values:
        for _, t in members(torch, v):
            if _placeable(t) and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _hook_reaches(torch, hooks, groups) -> bool:
    """Whether a hook's partial arguments, closure, globals, or the attributes of the object it is bound
    to hold a tensor over a placed storage (directly or as a dict's value); a hook that cannot be
    inspected counts as one that does."""
    ranges = [(lo, hi) for lo, hi, _ in groups.values()]
    for fn in hooks:
        seen = _reachable(fn)
        if seen is None:
            return True
        for v in seen:
            for item in (v.values() if isinstance(v, dict) else (v,)):
                for _, t in members(torch, item):
                    if t.numel() and any(lo < span_end(t) and t.data_ptr() < hi for lo, hi in ranges):
                        return True
    return False


def _reachable(fn) -> list | None:
    """What `fn` can reach other than through its arguments; None when that cannot be told."""
    seen: list = []
    while isinstance(fn, functools.partial):
        seen += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    if inspect.isbuiltin(fn):
        return seen
    owner = fn.__self__ if inspect.ismethod(fn) else None
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):   # a callable object
        owner, fn = fn, getattr(type(fn), "__call__", None)
        if not inspect.isfunction(fn):
            return None
    if owner is not None:
        seen += list(getattr(owner, "__dict__", {}).values())
    found = inspect.getclosurevars(fn)
    return [*seen, *found.nonlocals.values(), *found.globals.values()]


def _groups(torch, tensors) -> tuple[dict, str | None]:
    """{storage address: (lowest byte, end byte, [tensors])}, or why the tensors cannot be placed again."""
    groups: dict[int, list] = {}
    hip = getattr(torch.version, "hip", None)
    for t in tensors:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return {}, f"a {type(t).__name__} ({t.layout}) argument cannot be copied exactly"
        if t.numel() == 0:
            continue
        if hip and t.untyped_storage().nbytes() > 2**31 - 1:   # Triton's AMD backend specialises on it
            return {}, "an argument's storage is over 2 GiB: a copy would compile another kernel (buffer ops)"
        lo, hi = t.data_ptr(), span_end(t)
        base = t.untyped_storage().data_ptr()
        entry = groups.setdefault(base, [lo, hi, []])
        entry[0], entry[1] = min(entry[0], lo), max(entry[1], hi)
        entry[2].append(t)
    for lo, hi, members in groups.values():
        if any(t.data_ptr() % t.element_size() for t in members):   # a copy keeps each address mod 1 KiB
            return {}, "a tensor at an address its dtype cannot address"
    return {k: tuple(v) for k, v in groups.items()}, None


def span_end(t) -> int:
    """The end of the bytes a (non-empty, strided) tensor spans."""
    return t.data_ptr() + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


def span_bytes(torch, t, lo: int | None = None, hi: int | None = None):
    """The bytes from address `lo` to `hi` of `t`'s storage (default: those `t` spans) as a uint8 tensor:
    reading or writing it reaches `t`'s memory whatever its strides (broadcast, overlapping windows), and
    autograd never sees it (its own version counter, no graph): a copy made or put back through it is
    no in-place step of the caller's graph."""
    lo = t.data_ptr() if lo is None else lo
    hi = span_end(t) if hi is None else hi
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, lo - storage.data_ptr(), (hi - lo,), (1,))


def _free_bytes(torch, device) -> int | None:
    try:
        return int(torch.cuda.mem_get_info(device)[0])
    except Exception:  # noqa: BLE001 - unknown: the fixed limit alone
        return None


def _copy(torch, own: Site, groups: dict) -> Site:
    swapped: dict[int, Any] = {}
    for lo, hi, members in groups.values():
        first = members[0]
        extent = hi - lo
        buf = torch.empty(extent + ALIGN, dtype=torch.uint8, device=first.device)
        start = (lo - buf.data_ptr()) % ALIGN
        buf[start:start + extent].copy_(span_bytes(torch, first, lo, hi))
        for t in members:
            offset = start + t.data_ptr() - lo
            swapped[id(t)] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                buf.untyped_storage(), offset // t.element_size(), t.shape, t.stride())

    def swap(v):   # one copy object per original, so an argument and its bound name stay one object
        if id(v) in swapped or isinstance(v, torch.Tensor):
            return swapped.get(id(v), v)
        out = v
        if isinstance(v, (tuple, list)):
            items = [swap(item) for item in v]
            out = type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and id(getattr(v, "base", None)) in swapped:
            out = dataclasses.replace(v, base=swapped[id(v.base)])
        if out is not v:
            swapped[id(v)] = out
        return out
    return Site(tuple(swap(a) for a in own.args), {k: swap(v) for k, v in own.kwargs.items()},
                {k: swap(v) for k, v in own.bound.items()})
