"""The bytes the output check watches besides the call's tensors (`outputs.Check`): no launch may write
them, and the check puts them back after each. Around each tensor, its storage within GUARD_BYTES on each
side (a slice of a larger buffer: the rest of it is the caller's, or another's); within a tensor whose
elements leave gaps in the bytes it spans (a column slice: another head of a fused buffer), those gaps.
Never bytes any argument of the call spans, through whatever storage object (numpy views of one buffer,
DLPack): a kernel writes those legitimately.
"""
from __future__ import annotations

from typing import Any

GUARD_BYTES = 1 << 20   # bytes of a storage watched on each side of the call's tensors' spans
GAP_BYTES = 64 << 20    # the largest span whose gaps between elements are watched (a column slice)


def around(raw: dict[str, Any]) -> list[tuple]:
    """(name, where, bytes, their copy, which of them are watched: None, all) for the bytes within GUARD_BYTES
    around the call's tensors, in each tensor's storage, that no tensor of the call spans (a slice of a
    larger buffer: the rest is the caller's, or another's), and, for a tensor whose elements leave gaps in
    the bytes it spans (a column slice), those gaps (`_gaps`). Never memory any argument spans, through
    whatever storage object (numpy views of one buffer, DLPack): a kernel writes those legitimately.
    Windows that meet are one."""
    import torch

    from . import placement

    spans, storages = [], {}   # every tensor's (device, from, to, tensor); storage -> (its end, its tensors)
    for n, t in raw.items():
        try:
            if not t.numel() or t.layout != torch.strided:
                continue
            lo, hi, storage = t.data_ptr(), placement.span_end(t), t.untyped_storage()
            where = (t.device, storage.data_ptr(), storage.nbytes())   # two storages may share a start
            end = where[1] + where[2]
        except Exception:  # noqa: BLE001 - a tensor without a plain storage (a subclass): compared, not guarded
            continue
        spans.append((t.device, lo, hi, t))
        storages.setdefault(where, (end, []))[1].append((lo, hi, n, t))
    out = []
    for (dev, base, _), (end, mine) in storages.items():
        taken = sorted((lo, hi) for d, lo, hi, _ in spans if d == dev and lo < end and hi > base)
        free = []
        for lo, hi, n, t in sorted(mine, key=lambda m: m[:2]):
            for a, b, side in ((max(base, lo - GUARD_BYTES), lo, "before"), (hi, min(end, hi + GUARD_BYTES), "after")):
                free += [(x, y, n, t, side) for x, y in _uncovered(a, b, taken)]
            out += _gaps(torch, placement, n, t, lo, hi, [(a, b) for d, a, b, u in spans if d == dev and u is not t])
        merged: list[list] = []
        for x, y, n, t, side in sorted(free, key=lambda w: w[:2]):
            if merged and x <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], y)
            else:
                merged.append([x, y, n, t, side])
        for x, y, n, t, side in merged:
            memory = placement.span_bytes(torch, t, x, y)
            out.append((n, f"{side} its view", memory, memory.clone(), None))
    return out


def _gaps(torch, placement, name: str, t, lo: int, hi: int, others: list) -> list[tuple]:
    """The guard of the bytes between `t`'s elements within its span (a column slice's rows: another head of a
    fused buffer), less every other argument's span; none where there are none, or the span is over GAP_BYTES."""
    e = t.element_size()
    if t.numel() * e >= hi - lo or hi - lo > GAP_BYTES:
        return []
    which = torch.ones(hi - lo, dtype=torch.bool, device=t.device)
    torch.as_strided(which, (*t.shape, e), (*(s * e for s in t.stride()), 1)).fill_(False)   # its own elements
    for a, b in others:
        if a < hi and b > lo:
            which[max(a, lo) - lo:min(b, hi) - lo] = False
    if not bool(which.any()):
        return []
    memory = placement.span_bytes(torch, t, lo, hi)
    return [(name, "between its elements", memory, memory.clone(), which)]


def _uncovered(lo: int, hi: int, taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [lo, hi) no interval of `taken` (sorted) covers."""
    out = []
    for a, b in taken:
        if b <= lo or a >= hi:
            continue
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
        if lo >= hi:
            return out
    return out + [(lo, hi)] if lo < hi else out
