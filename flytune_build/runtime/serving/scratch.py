"""The scratch cache: searched winners on this machine, keyed on everything that can change a winner.

One JSON file per kernel under FLYTUNE_CACHE_DIR (default: the platform's user cache dir). Writers
merge under a file lock and replace the file atomically, so concurrent processes lose nothing and a
killed writer leaves the previous file intact. A corrupt file is ignored with one warning and replaced.
Reads are of regular files only, capped; writes are best effort: a cache that cannot be written is one
warning, and the winner stays in memory (a kernel call never fails for its cache).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ...core import codec, fsutil, settings
from ...core.errors import FlytuneError, ScratchError
from ...core.fsutil import atomic_write
from .. import warning

FORMAT_VERSION = 1
MAX_BYTES = 64 << 20
LOCK_TIMEOUT = 10.0  # seconds: a stopped lock holder delays one write this long, then the write is skipped


def cache_dir() -> Path:
    configured = settings.current().cache_dir
    if configured is not None:
        return configured
    import platformdirs

    return Path(platformdirs.user_cache_dir("flytune", appauthor=False)) / "scratch"


def entry_key(parts: dict) -> str:
    """Address of one winner: sha256 of the canonical parts (key, layout, device, toolchain, env, space)."""
    return hashlib.sha256(codec.canonical(parts)).hexdigest()


class ScratchCache:
    def __init__(self, kernel: str):
        self.kernel = kernel
        # "entries" -> the winners, once read: a one-key dict, so a reader that read before a `put` wrote can
        # only add them where none are (`setdefault`, one step under the GIL), never undo that write
        self._loaded: dict[str, dict[str, Any]] = {}

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.kernel}.json"

    def _read(self) -> dict[str, Any]:
        path = self.path
        if not os.path.lexists(path):
            return {}
        try:  # a regular file, capped: a FIFO does not hang the call, a link to /dev/zero is not read
            data = fsutil.read_regular(path, ScratchError, MAX_BYTES)
        except ScratchError as e:
            warning.once(("scratch", str(path)), f"{e}; scratch cache ignored")
            return {}
        try:
            doc = codec.loads(data, file=path, error=ScratchError, max_bytes=MAX_BYTES)
            if not (isinstance(doc, dict) and doc.get("format") == FORMAT_VERSION
                    and isinstance(doc.get("entries"), dict)):
                raise ScratchError("is not a flytune scratch cache (format 1)", file=path)
            return doc["entries"]
        except FlytuneError as e:
            warning.once(("scratch", str(path)), f"{e}; ignored, it will be replaced on the next write")
            return {}

    def entries(self) -> dict[str, Any]:
        """The winners searched on this machine, read once, at this kernel's first decision."""
        entries = self._loaded.get("entries")
        return entries if entries is not None else self._loaded.setdefault("entries", self._read())

    def get(self, key: str) -> Any:
        return self.entries().get(key)

    def put(self, key: str, value: Any) -> None:
        """Merge one winner into the file under a lock; atomic, so nothing is lost or half-written.
        Best effort: a cache that cannot be written (unwritable, a file in the way, read-only, full,
        a lock held past LOCK_TIMEOUT, a lock path that is a symlink) is one warning, and the winner
        is kept in memory for this process; the call that searched it never fails for it."""
        try:
            self._write(key, value)
        except (OSError, FlytuneError) as e:  # filelock's Timeout is an OSError
            reason = (e.strerror if isinstance(e, OSError) else None) or str(e)
            warning.once(("scratch-write", str(self.path.parent)),
                         f"flytune: the scratch cache {self.path.parent} cannot be written ({type(e).__name__}: "
                         f"{reason}); searched winners are kept in memory for this process only")
            self.entries()[key] = value

    def _write(self, key: str, value: Any) -> None:
        """The file's entries and this one written, and kept as this process's (under the lock: another
        thread's write after this one's is never undone in memory by this one's older read)."""
        from filelock import FileLock

        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = str(path) + ".lock"
        if os.path.islink(lock):  # an older filelock opens it with O_TRUNC, truncating whatever it points to
            raise ScratchError("is a symlink: refused as a lock file", file=lock)
        with FileLock(lock, timeout=LOCK_TIMEOUT):
            entries = self._read()
            entries[key] = value
            atomic_write(path, codec.canonical({"format": FORMAT_VERSION, "kernel": self.kernel,
                                                "entries": entries}))
            self._loaded["entries"] = entries
