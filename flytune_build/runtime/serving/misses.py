"""FLYTUNE_MISSES: this process's keys that no tuned config served, recorded for the next tune.

A decision served by the heuristic, the first config or a search is a miss. `record` keeps it in memory
and wakes this process's writer thread, which adds to FILE what changed since its last write (the new
decision, the calls served since); the exit's `flush` adds the rest. The hot path is untouched (calls
are counted by the decision as always), and a kernel call never reads or writes FILE nor waits on its
lock.

Invariants:
- Exact counts: a write adds, per key, only what this process served since its last successful write
  (its decisions and its calls, as one delta); what a write could not add stays for the next.
- A forked child counts only what it serves: every call of every decision made before the fork, and
  the decision itself, are the parent's to write.
- One real file, one lock: FILE is resolved (core.misses.real) before its lock is chosen and before it
  is read or written, so a process naming it through a symlink meets every other process's lock.
- A key that no longer fits (core.misses.MAX_ENTRIES) is counted in `dropped` once per process, then
  never offered again.
- At most one bounded wait per process: a write waits for FILE's lock up to core.misses.LOCK_TIMEOUT;
  after one timeout, later writes only try (RETRY_TIMEOUT). Writes happen on the writer thread or in
  `flush`, never in a kernel call.
- Recording never fails a kernel call: a FILE that cannot be written or a lock held too long is one
  warning per FILE (runtime.warning), and the misses stay in memory for the next write.
- The writer thread imports nothing: what a write needs is imported with this module. A fork made while
  another thread imports a module leaves the child waiting forever on that module's import lock (its
  holder does not exist there), and a server forks its workers while this thread may be writing.

State: `_pending` (one `Log`) is this process's: its recorded decisions, each with the calls and the
decision already counted, the keys it saw dropped, whether a lock wait timed out, its writer thread.
`_lock` guards the log's entries and thread; `_registered` says the exit's `flush` is registered (an
atexit function a forked child inherits; a multiprocessing child, which ends in os._exit, flushes as
its finalizers run, whether this module was imported before its fork or first in it). A forked child (os.register_at_fork) gets a new `Log` of the same decisions with
every call so far and every decision counted as the parent's, no writer thread, no dropped keys, no
timeout, and a fresh `_lock`: nothing it would count twice.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from dataclasses import dataclass, field
from multiprocessing import util as multiprocessing_util  # loaded with torch already
from typing import Any

from filelock import FileLock, Timeout

from ...core import codec, settings
from ...core import misses as misses_file
from ...core.errors import InputError
from .. import warning

SERVED = ("scratch", "offline")  # the tiers that serve tuned configs: anything else is a miss
RETRY_TIMEOUT = 0.5  # seconds a write waits for FILE's lock once a wait has timed out in this process
IDLE = 1.0           # seconds the writer thread waits for another decision before it ends


@dataclass(eq=False)
class Entry:
    """One recorded decision: where it is recorded, and how much of it this process has counted."""
    path: str         # FILE as named (absolute); resolved at each write
    kernel: str
    key: dict
    device: str
    tier: str
    decision: Any     # the Decision whose `calls` the hot path counts
    counted: int = 0  # its calls already added to FILE (in a forked child: the parent's)
    decided: bool = False  # whether its decision is added to FILE (in a forked child: the parent's)
    ident: tuple = field(init=False)  # (kernel, key, device): one entry of FILE

    def __post_init__(self):
        self.ident = (self.kernel, codec.canonical(self.key), self.device)


class Log:
    """This process's misses: the recorded decisions, what of them is written, how writes go."""

    def __init__(self, entries: list[Entry] | None = None):
        self.entries: list[Entry] = entries or []
        self.dropped: set[tuple] = set()  # (real FILE, ident) counted in `dropped`: never offered again
        self.stalled = False              # a lock wait timed out: later writes only try
        self.wake = threading.Event()     # a decision to write
        self.writing = threading.Lock()   # one write at a time: the writer thread's or flush's
        self.thread: threading.Thread | None = None
        self.closed = False               # reset() or a fork replaced this log: its thread ends

    def forked(self) -> Log:
        """The log a forked child starts with: the same decisions, all counted (the parent's)."""
        return Log([Entry(e.path, e.kernel, e.key, e.device, e.tier, e.decision, e.decision.calls, True)
                    for e in self.entries])


_pending = Log()
_lock = threading.Lock()
_registered = False


def tier_of(d) -> str:
    return "first config" if getattr(d, "first", False) else d.first_tier


def record(kernel: str, d, device: str) -> None:
    """Record `d` (a new decision of `kernel`) where FLYTUNE_MISSES is set and no tuned config served it:
    kept in memory and written by the writer thread, never here (no file, no lock, no wait)."""
    path = settings.current().misses  # read at decision time: a tuning session's override says None
    if path is None or d.first_tier in SERVED:
        return
    global _registered
    try:
        entry = Entry(os.path.abspath(path), kernel, dict(d.key), device, tier_of(d), d)
    except (ValueError, TypeError) as e:   # a key JSON cannot hold (NaN, inf): recording never fails a call
        _warn(str(path), f"kernel {kernel}'s key {d.key} cannot be written as JSON ({e}), so it is not recorded")
        return
    with _lock:
        log = _pending
        log.entries.append(entry)
        log.wake.set()
        if log.thread is None:
            _start(log)
        if not _registered:
            atexit.register(flush)
            if multiprocessing.parent_process() is not None:   # a multiprocessing child this module was first
                _flush_at_child_exit(None)                      # imported in (a pool's worker): it ends in os._exit
            _registered = True


def flush() -> None:
    """Write what this process's misses gained since their last write: at exit, and where a caller
    must see FILE complete (tests; a worker about to os._exit). Waits for the writer thread's write."""
    _write(_pending)


def reset() -> None:
    """Forget the decisions not yet written, write nothing (flytune_build.reset_stats, tests)."""
    global _pending
    with _lock:
        old, _pending = _pending, Log()
    old.closed = True
    old.wake.set()


def _start(log: Log) -> None:
    thread = threading.Thread(target=_run, args=(log,), name="flytune-misses", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # at interpreter shutdown: the exit's flush writes it
        return
    log.thread = thread


def _run(log: Log) -> None:
    """The writer thread: one write per wake, until IDLE seconds pass without a decision."""
    while True:
        log.wake.wait(IDLE)
        with _lock:
            if log.closed or not log.wake.is_set():
                log.thread = None
                return
            log.wake.clear()
        _write(log)


def _write(log: Log) -> None:
    """Add to FILE what `log`'s decisions gained since their last write: per key one delta, its decisions
    and calls together; what is not written stays for the next write."""
    with log.writing:
        with _lock:
            entries = list(log.entries)
        reals: dict[str, str] = {}  # FILE as named -> its real path, resolved once a write
        by_path: dict[str, dict[tuple, list]] = {}  # real FILE -> ident -> [calls, decisions, entry, [(entry, calls)]]
        for e in entries:
            calls = e.decision.calls
            if calls == e.counted and e.decided:
                continue
            where = reals.get(e.path) or reals.setdefault(e.path, str(misses_file.real(e.path)))
            row = by_path.setdefault(where, {}).setdefault(e.ident, [0, 0, e, []])
            row[0] += calls - e.counted if calls >= e.counted else calls  # a counter restarted: all since
            row[1] += not e.decided
            row[2] = e
            row[3].append((e, calls))
        for path, rows in by_path.items():
            if _update(log, path, rows):
                for _, _, _, seen in rows.values():
                    for e, calls in seen:
                        e.counted, e.decided = calls, True


def _update(log: Log, path: str, rows: dict) -> bool:
    """Add `rows` to FILE (`path`: its real path) under its lock, all or none; a key that no longer fits
    is remembered in `log.dropped` (counted once: never offered again). False where nothing was written."""
    fresh = [ident for ident in rows if (path, ident) not in log.dropped]
    if not fresh:
        return True
    timeout = misses_file.LOCK_TIMEOUT if not log.stalled else min(RETRY_TIMEOUT, misses_file.LOCK_TIMEOUT)
    try:
        lock = misses_file.lock_file(path)
        if os.path.islink(lock):  # an older filelock opens it with O_TRUNC, truncating whatever it points to
            raise InputError("is a symlink: refused as a lock file", file=lock)
        with FileLock(str(lock), timeout=timeout):
            doc = misses_file.load(path)
            kept = misses_file.merge(doc, [(e.kernel, e.key, e.device, e.tier, calls, decisions)
                                           for calls, decisions, e, _ in (rows[i] for i in fresh)])
            misses_file.write(path, doc)
    except Timeout:
        log.stalled = True
        _warn(path, f"another process has held its lock for over {timeout:g} s; this process's misses stay in "
                    f"memory and are written when it is free (no later write waits more than {RETRY_TIMEOUT:g} s)")
        return False
    except Exception as e:  # noqa: BLE001 - recording never fails a kernel call: one warning, the call goes on
        _warn(path, f"{type(e).__name__}: {e}")
        return False
    log.dropped.update((path, ident) for ident, k in zip(fresh, kept) if not k)
    return True


def _warn(path: str, why: str) -> None:
    warning.once(("misses", path),
                 f"FLYTUNE_MISSES ({path}): cannot record this process's misses now ({why}); the kernels run as before")


def _after_fork_in_child() -> None:
    """No lock is held across the fork (another at-fork hook may wait meanwhile, `warming.forks`): the log's
    entries are a list, appended in one step under the GIL, and the child counts each as the parent's."""
    global _pending, _lock
    parent, _pending, _lock = _pending, _pending.forked(), threading.Lock()
    parent.closed = True  # the parent's writer thread does not exist here; nothing may wait on it


def _flush_at_child_exit(_) -> None:
    """A multiprocessing child (fork, forkserver) ends in os._exit after its finalizers, never atexit."""
    multiprocessing_util.Finalize(None, flush, exitpriority=0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
multiprocessing_util.register_after_fork(flush, _flush_at_child_exit)
