"""Production misses: the keys a serving process met that no tuned config served, as a tuning plan.

With FLYTUNE_MISSES=FILE, every kernel decision served by the heuristic, the first config or a search
(neither the scratch nor the offline tier) is recorded in FILE: kernel, key, device, the tier that
served it, how many calls and decisions, first and last seen. Many processes may share one FILE:
each update is a read-modify-write under a file lock (filelock), written atomically; FILE holds at
most MAX_ENTRIES keys (later ones are counted in `dropped`, never written) and is read capped.

`flytune tune --misses FILE` tunes exactly those shapes: each missed kernel's plan entry (its setup,
from the project's tuning plan) with the misses' keys as shapes, less the tensor axes (a key's
dtype values: the setup chooses the tensors). A miss whose kernel the plan does not hold is named,
never tuned silently.

Pure: no torch, no triton.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import codec, fsutil
from .codec import Fields
from .errors import InputError, UsageError
from .key import is_dtype_name

FORMAT = 1
MAX_ENTRIES = 10_000
MAX_BYTES = 8 << 20
LOCK_TIMEOUT = 10.0  # seconds: a process never waits longer to record (it warns and goes on)


@dataclass(frozen=True)
class Miss:
    kernel: str
    key: dict
    device: str
    tier: str
    calls: int
    decisions: int


def empty() -> dict:
    return {"format": FORMAT, "misses": [], "dropped": 0}


def load(path: Path) -> dict:
    """FILE's document, checked; an absent FILE is an empty one."""
    try:
        data = fsutil.read_regular(path, InputError, MAX_BYTES)
    except InputError:
        if not path.exists():
            return empty()
        raise
    doc = codec.loads(data, file=path, error=InputError, max_bytes=MAX_BYTES)
    f = Fields(path, InputError)
    f.table(doc, "", ("format", "misses"), ("dropped",))
    if type(doc["format"]) is not int or doc["format"] != FORMAT:
        f.fail("format", f"is unknown format {doc['format']!r} (this flytune reads {FORMAT})")
    if "dropped" in doc and (type(doc["dropped"]) is not int or doc["dropped"] < 0):
        f.fail("dropped", "must be a count (an integer >= 0)")

    def entry(v, at):
        f.table(v, at, ("kernel", "key", "device", "tier", "calls", "decisions"), ("first_seen", "last_seen"))
        f.string(v["kernel"], f"{at}.kernel", max_len=200)
        f.mapping(v["key"], f"{at}.key")
        for name in ("device", "tier"):
            f.string(v[name], f"{at}.{name}", max_len=256)
        for name in ("calls", "decisions"):
            if type(v[name]) is not int or v[name] < 0:
                f.fail(f"{at}.{name}", "must be a count (an integer >= 0)")

    f.array(doc["misses"], "misses", entry, max_items=MAX_ENTRIES)
    seen = set()
    for i, m in enumerate(doc["misses"]):
        ident = codec.canonical([m["kernel"], m["key"], m["device"]])
        if ident in seen:
            f.fail(f"misses[{i}]", "repeats an earlier entry's kernel, key and device")
        seen.add(ident)
    return doc


def add(doc: dict, kernel: str, key: dict, device: str, tier: str, calls: int, decisions: int) -> dict:
    """`doc` with one record more (or one record's counts raised): a key is one entry per device."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for m in doc["misses"]:
        if m["kernel"] == kernel and m["key"] == key and m["device"] == device:
            m["calls"] += calls
            m["decisions"] += decisions
            m["tier"] = tier
            m["last_seen"] = now
            return doc
    if len(doc["misses"]) >= MAX_ENTRIES:
        doc["dropped"] = doc.get("dropped", 0) + 1
        return doc
    doc["misses"].append({"kernel": kernel, "key": key, "device": device, "tier": tier, "calls": calls,
                          "decisions": decisions, "first_seen": now, "last_seen": now})
    return doc


def write(path: Path, doc: dict) -> None:
    """Write `doc` atomically, through a symlink (the link stays), never over the read cap: the keys
    most recently seen are kept, the rest counted in `dropped`."""
    data = codec.canonical(doc) + b"\n"
    while len(data) > MAX_BYTES and doc["misses"]:
        cut = max(1, len(doc["misses"]) // 10)
        doc["misses"].sort(key=lambda m: m.get("last_seen", ""))
        del doc["misses"][:cut]
        doc["dropped"] = doc.get("dropped", 0) + cut
        data = codec.canonical(doc) + b"\n"
    fsutil.atomic_write(Path(os.path.realpath(path)), data)


def misses(doc: dict) -> list[Miss]:
    return [Miss(m["kernel"], dict(m["key"]), m["device"], m["tier"], m["calls"], m["decisions"])
            for m in doc["misses"]]


def plan(found: list[Miss], entries, file: object) -> tuple[tuple, list[str]]:
    """(plan entries with exactly the missed shapes, notes on misses no plan entry can tune). `entries`
    are the project's plan entries (core.project.TuneEntry): a missed kernel takes its entry's setup."""
    by_kernel = {e.kernel: e for e in entries}
    shapes: dict[str, list[dict]] = {}
    notes = []
    for m in found:
        if m.kernel not in by_kernel:
            notes.append(f"{m.kernel} {m.key}: missed {m.calls} call(s) on {m.device}, but the tuning plan has no "
                         f"entry for {m.kernel} (add one with its setup)")
            continue
        shape = {k: v for k, v in m.key.items() if not is_dtype_name(v) and v is not None}
        if shape not in shapes.setdefault(m.kernel, []):
            shapes[m.kernel].append(shape)
    out = tuple(replace(by_kernel[k], shapes=tuple(s)) for k, s in shapes.items())
    if not out:
        raise UsageError(f"{file}: no miss names a kernel of the tuning plan; nothing to tune"
                         + (f" ({notes[0]})" if notes else ""))
    return out, notes
