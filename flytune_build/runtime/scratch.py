"""The scratch cache: searched winners on this machine, keyed on everything that can change a winner.

One JSON file per kernel under FLYTUNE_CACHE_DIR (default: the platform's user cache dir). Writers
merge under a file lock and replace the file atomically, so concurrent processes lose nothing and a
killed writer leaves the previous file intact. A corrupt file is ignored with one warning and replaced.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..core import codec, settings
from ..core.errors import FlytuneError, ScratchError
from ..core.fsutil import atomic_write
from . import warning

FORMAT_VERSION = 1
MAX_BYTES = 64 << 20


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
        self._entries: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.kernel}.json"

    def _read(self) -> dict[str, Any]:
        path = self.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            warning.once(("scratch", str(path)), f"{path}: cannot be read ({e.strerror}); scratch cache ignored")
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

    def get(self, key: str) -> Any:
        if self._entries is None:
            self._entries = self._read()
        return self._entries.get(key)

    def put(self, key: str, value: Any) -> None:
        """Merge one winner into the file under a lock; atomic, so nothing is lost or half-written."""
        from filelock import FileLock

        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            entries = self._read()
            entries[key] = value
            atomic_write(path, codec.canonical({"format": FORMAT_VERSION, "kernel": self.kernel,
                                                "entries": entries}))
        self._entries = entries
