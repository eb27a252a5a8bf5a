"""Copies of a search's tensor inputs at other device addresses, so that its timings sample where the
data lies as well as how long the kernel runs.

Why: on an H200 a few-microsecond kernel's time moves with the addresses of its inputs and from one
process to the next, by far more than it moves between repeats. Timed on the caller's tensors alone,
rmsnorm (256 x 1024, fp16) measured one config 20% slower than another in one cold process and 2.5%
faster in the next, while each process repeated its own figures within 0.5%
(`benchmarks/timing_bias.py`: 2-11% across six placements in one process, the same again across
processes). A search that times each round on another placement turns that bias into dispersion,
which the tie band then sees (`selection`), and its medians agree from one process to the next.

Invariants:
- placement 0 is the caller's own tensors; every other placement holds a copy of the bytes each device
  tensor argument spans, in a fresh allocation, at an address with the same remainder modulo 1 KiB
  (Triton specialises on 16-byte alignment: every placement runs the same compiled kernel);
- tensors that share storage share it in every placement (aliasing and views are kept);
- what cannot be copied exactly (a tensor subclass, a non-strided layout, a dtype mismatch within a
  storage) or too many bytes (`LIMIT_BYTES`, or a quarter of the device's free memory) leaves one
  placement, and `note` says why;
- copies are never written back: the caller's tensors are only ever placement 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALIGN = 1024                # every copy keeps its original's address modulo 1 KiB
LIMIT_BYTES = 1 << 30       # at most 1 GiB of copies in all


@dataclass
class Site:
    """One placement of the call: its arguments and its bound parameters (name -> value)."""
    args: tuple
    kwargs: dict
    bound: dict
    buffers: list = field(default_factory=list, repr=False)   # the allocations the copies live in


@dataclass
class Placements:
    sites: list[Site]
    note: str | None = None    # why there is only one placement, when there is

    def __len__(self) -> int:
        return len(self.sites)


def spread(args: tuple, kwargs: dict, bound: dict, count: int) -> Placements:
    """`count` placements of this call (fewer, with a `note`, when its tensors cannot be copied)."""
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


def _device_tensors(torch, values) -> list:
    seen, out = set(), []
    for v in values:
        if isinstance(v, torch.Tensor) and _placeable(v) and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _groups(torch, tensors) -> tuple[dict, str | None]:
    """{storage address: (lowest byte, end byte, [tensors])}, or why the tensors cannot be placed again."""
    groups: dict[int, list] = {}
    for t in tensors:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return {}, f"a {type(t).__name__} ({t.layout}) argument cannot be copied exactly"
        if t.numel() == 0:
            continue
        span = t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
        lo = t.data_ptr()
        base = t.untyped_storage().data_ptr()
        entry = groups.setdefault(base, [lo, lo + span, []])
        entry[0], entry[1] = min(entry[0], lo), max(entry[1], lo + span)
        entry[2].append(t)
    for lo, hi, members in groups.values():
        if any((t.data_ptr() - lo) % t.element_size() for t in members):
            return {}, "tensors of one storage at offsets their dtypes cannot address"
    return {k: tuple(v) for k, v in groups.items()}, None


def _free_bytes(torch, device) -> int | None:
    try:
        return int(torch.cuda.mem_get_info(device)[0])
    except Exception:  # noqa: BLE001 - unknown: the fixed limit alone
        return None


def _copy(torch, own: Site, groups: dict) -> Site:
    swapped: dict[int, Any] = {}
    buffers = []
    for lo, hi, members in groups.values():
        first = members[0]
        extent = hi - lo
        buf = torch.empty(extent + ALIGN, dtype=torch.uint8, device=first.device)
        start = (lo - buf.data_ptr()) % ALIGN
        source = torch.empty(0, dtype=torch.uint8, device=first.device).set_(
            first.untyped_storage(), lo - first.untyped_storage().data_ptr(), (extent,), (1,))
        buf[start:start + extent].copy_(source)
        buffers.append(buf)
        for t in members:
            offset = start + t.data_ptr() - lo
            swapped[id(t)] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                buf.untyped_storage(), offset // t.element_size(), t.shape, t.stride())

    def swap(v):
        return swapped.get(id(v), v)
    return Site(tuple(swap(a) for a in own.args), {k: swap(v) for k, v in own.kwargs.items()},
                {k: swap(v) for k, v in own.bound.items()}, buffers)
