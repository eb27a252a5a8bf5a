"""FLYTUNE_MISSES: this process's keys that no tuned config served, recorded for the next tune.

A decision served by the heuristic, the first config or a search is recorded once, when it is made
(so a process that dies still leaves it), and its calls are added when the process exits. Recording
never fails a kernel call: a FILE that cannot be written, or a lock held past core.misses.LOCK_TIMEOUT,
is one warning. The hot path is untouched: calls are counted by the decision as always.
"""
from __future__ import annotations

import atexit
import threading

from ..core import misses as misses_file
from ..core import settings
from . import warning

SERVED = ("scratch", "offline")  # the tiers that serve tuned configs: anything else is a miss
_pending: list[tuple] = []         # (path, kernel, key, device, tier, decision) whose calls exit adds
_lock = threading.Lock()
_registered = False


def tier_of(d) -> str:
    return "first config" if getattr(d, "first", False) else d.first_tier


def record(kernel: str, d, device: str) -> None:
    """Record `d` (a new decision of `kernel`) where FLYTUNE_MISSES is set and no tuned config served it."""
    path = settings.current().misses
    if path is None or d.first_tier in SERVED:
        return
    path = path.absolute()  # one file for the process, whatever the working directory becomes
    global _registered
    entry = (path, kernel, dict(d.key), device, tier_of(d), d)
    if _update(path, [(kernel, dict(d.key), device, tier_of(d), 0, 1)]):
        with _lock:
            _pending.append(entry)
            if not _registered:
                atexit.register(flush)
                _registered = True


def flush() -> None:
    """Add the calls each recorded decision served since it was made (at exit; tests call it)."""
    with _lock:
        pending, _pending[:] = list(_pending), []
    by_path: dict = {}
    for path, kernel, key, device, tier, d in pending:
        if d.calls:
            by_path.setdefault(path, []).append((kernel, key, device, tier, d.calls, 0))
    for path, rows in by_path.items():
        _update(path, rows)


def _update(path, rows) -> bool:
    from filelock import FileLock

    try:
        with FileLock(str(path) + ".lock", timeout=misses_file.LOCK_TIMEOUT):
            doc = misses_file.load(path)
            for row in rows:
                misses_file.add(doc, *row)
            misses_file.write(path, doc)
        return True
    except Exception as e:  # noqa: BLE001 - recording never fails a kernel call: one warning, the call goes on
        warning.once(("misses", str(path)), f"FLYTUNE_MISSES={path}: cannot record this process's misses "
                     f"({type(e).__name__}: {e}); the kernels run as before")
        return False
