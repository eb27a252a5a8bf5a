"""Production misses: the keys a serving process met that no tuned config served, as a tuning plan.

With FLYTUNE_MISSES=FILE, every kernel decision served by the heuristic, the first config or a search
(neither the scratch nor the offline tier) is recorded in FILE: kernel, key, device, the tier that
served it, how many calls and decisions, first and last seen. Many processes may share one FILE:
each update is a read-modify-write under a file lock (filelock), written atomically; FILE holds at
most MAX_ENTRIES keys (later ones are counted in `dropped`, never written) and is read capped.

Invariants:
- One file, one lock: FILE is its real path (`real`: symlinks resolved), whatever path or link a
  process names it by, and its lock is `lock_file(FILE)` beside the real file.
- A key's values are JSON scalars (a number, a string, a boolean, null): a key holding an array or an
  object is an InputError naming the file and the field (`misses[0].key.n`), never a shape to tune.
- `add` counts a key that no longer fits in `dropped` each time it is offered: a writer offers each key
  once per process (runtime.serving.misses remembers the keys it saw dropped).

`flytune tune --misses FILE` tunes exactly those shapes (`read`, then `plan`): each missed kernel's
plan entry (its setup, from the project's tuning plan) with the misses' keys as shapes, less the tensor
axes (a key's dtype values: the setup chooses the tensors). A FILE that does not exist says so; a miss
whose kernel the plan does not hold is named (a note per kernel), never tuned silently.

Pure: no torch, no triton.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import codec, fsutil
from .codec import Fields, kind
from .errors import InputError, UsageError
from .key import is_dtype_name

FORMAT = 1
MAX_ENTRIES = 10_000
MAX_BYTES = 8 << 20
LOCK_TIMEOUT = 10.0  # seconds: the longest a process ever waits to record, once (then it warns and goes on)
SCALARS = (bool, int, float, str, type(None))  # what a key's value may be


@dataclass(frozen=True)
class Miss:
    kernel: str
    key: dict
    device: str
    tier: str
    calls: int
    decisions: int


def real(path: str | os.PathLike) -> Path:
    """FILE as every process names it: absolute, symlinks resolved (a dangling link: its target)."""
    return Path(os.path.realpath(os.path.abspath(path)))


def lock_file(path: str | os.PathLike) -> Path:
    """The one lock of FILE, however it is named: beside the real file."""
    p = real(path)
    return p.with_name(p.name + ".lock")


def empty() -> dict:
    return {"format": FORMAT, "misses": [], "dropped": 0}


def load(path: Path) -> dict:
    """FILE's document (read through its real path), checked; an absent FILE, or one holding nothing but
    blanks, is an empty one."""
    path = Path(path)
    try:
        data = fsutil.read_regular(real(path), InputError, MAX_BYTES)
    except InputError:
        if not path.exists():
            return empty()
        raise
    if not data.strip():   # a file made empty (`touch`, a mount's placeholder) holds no misses
        return empty()
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
        for name, value in v["key"].items():
            if not isinstance(value, SCALARS):
                f.fail(f"{at}.key.{name}", f"must be a number, a string, a boolean or null (a key's value is "
                                           f"one scalar), not {kind(value)}")
        for name in ("device", "tier"):
            f.string(v[name], f"{at}.{name}", max_len=256)
        for name in ("calls", "decisions"):
            if type(v[name]) is not int or v[name] < 0:
                f.fail(f"{at}.{name}", "must be a count (an integer >= 0)")

    f.array(doc["misses"], "misses", entry, max_items=MAX_ENTRIES)
    seen = set()
    for i, m in enumerate(doc["misses"]):
        ident = _ident(m["kernel"], m["key"], m["device"])
        if ident in seen:
            f.fail(f"misses[{i}]", "repeats an earlier entry's kernel, key and device")
        seen.add(ident)
    return doc


def add(doc: dict, kernel: str, key: dict, device: str, tier: str, calls: int, decisions: int) -> dict:
    """`doc` with one record more (or one record's counts raised): a key is one entry per device. A new
    key past MAX_ENTRIES is not written: `dropped` counts it, once for each time it is offered."""
    ident = _ident(kernel, key, device)
    m = next((m for m in doc["misses"] if m["kernel"] == kernel and m["device"] == device and m["key"] == key
              and _ident(kernel, m["key"], device) == ident), None)  # 1 == True in Python, never in a key
    _put(doc, m, kernel, key, device, tier, calls, decisions, _now())
    return doc


def merge(doc: dict, rows) -> list[bool]:
    """`add` each row (kernel, key, device, tier, calls, decisions) to `doc`, the entries indexed once;
    for each row, whether it is in `doc` (False: it no longer fits, and `dropped` counted it)."""
    now = _now()
    index = {_ident(m["kernel"], m["key"], m["device"]): m for m in doc["misses"]}
    kept = []
    for kernel, key, device, tier, calls, decisions in rows:
        ident = _ident(kernel, key, device)
        m = index[ident] = _put(doc, index.get(ident), kernel, key, device, tier, calls, decisions, now)
        kept.append(m is not None)
    return kept


def _put(doc: dict, m: dict | None, kernel: str, key: dict, device: str, tier: str, calls: int, decisions: int,
         now: str) -> dict | None:
    """Raise entry `m`'s counts, or append a new one where it fits; the entry, or None: counted in `dropped`."""
    if m is not None:
        m["calls"] += calls
        m["decisions"] += decisions
        m["tier"] = tier
        m["last_seen"] = now
    elif len(doc["misses"]) >= MAX_ENTRIES:
        doc["dropped"] = doc.get("dropped", 0) + 1
    else:
        m = {"kernel": kernel, "key": key, "device": device, "tier": tier, "calls": calls, "decisions": decisions,
             "first_seen": now, "last_seen": now}
        doc["misses"].append(m)
    return m


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _ident(kernel: str, key: dict, device: str) -> bytes:
    return codec.canonical([kernel, key, device])


def write(path: Path, doc: dict) -> None:
    """Write `doc` atomically to FILE's real path (a link stays a link), never over the read cap: the
    keys most recently seen are kept, the rest counted in `dropped`."""
    data = codec.canonical(doc) + b"\n"
    while len(data) > MAX_BYTES and doc["misses"]:
        cut = max(1, len(doc["misses"]) // 10)
        doc["misses"].sort(key=lambda m: m.get("last_seen", ""))
        del doc["misses"][:cut]
        doc["dropped"] = doc.get("dropped", 0) + cut
        data = codec.canonical(doc) + b"\n"
    fsutil.atomic_write(real(path), data)


def misses(doc: dict) -> list[Miss]:
    return [Miss(m["kernel"], dict(m["key"]), m["device"], m["tier"], m["calls"], m["decisions"])
            for m in doc["misses"]]


def read(path: str | os.PathLike) -> list[Miss]:
    """FILE's misses, for `flytune tune --misses FILE`: unlike `load` (a serving process's first record
    starts an absent FILE), a FILE that does not exist is a UsageError saying so."""
    path = Path(path)
    if not path.exists():
        raise UsageError("does not exist (FLYTUNE_MISSES=FILE records misses there while kernels serve): "
                         "nothing to tune", file=path)
    return misses(load(path))


def plan(found: list[Miss], entries, file: object) -> tuple[tuple, list[str]]:
    """(plan entries with exactly the missed shapes, notes on misses no plan entry can tune: one per
    kernel). `entries` are the project's plan entries (core.project.TuneEntry): a missed kernel takes
    its entry's setup. A UsageError where nothing is left to tune."""
    by_kernel = {e.kernel: e for e in entries}
    shapes: dict[str, list[dict]] = {}
    untuned: dict[str, list[Miss]] = {}
    for m in found:
        if m.kernel not in by_kernel:
            untuned.setdefault(m.kernel, []).append(m)
            continue
        shape = {k: v for k, v in m.key.items() if not is_dtype_name(v) and v is not None}
        if shape not in shapes.setdefault(m.kernel, []):
            shapes[m.kernel].append(shape)
    notes = [_untuned(kernel, ms) for kernel, ms in untuned.items()]
    out = tuple(replace(by_kernel[k], shapes=tuple(s)) for k, s in shapes.items())
    if not found:
        raise UsageError(f"{file}: records no miss; nothing to tune")
    if not out:
        raise UsageError(f"{file}: no miss names a kernel of the tuning plan; nothing to tune ({'; '.join(notes[:3])}"
                         + (f"; {len(notes) - 3} more kernel(s))" if len(notes) > 3 else ")"))
    return out, notes


def _untuned(kernel: str, found: list[Miss]) -> str:
    keys = ", ".join(str(m.key) for m in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    devices = ", ".join(sorted({m.device for m in found}))
    return (f"{kernel}: {len(found)} missed key(s) ({keys}), {sum(m.calls for m in found)} call(s) on {devices}, "
            f"but the tuning plan has no entry for {kernel} (add one with its setup)")
