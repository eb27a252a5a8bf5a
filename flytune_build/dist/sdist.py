"""Rewrite an sdist reproducibly, carrying the artifact sources so sdist -> wheel gives the same bundle."""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from ..core.errors import ProjectError
from ..core.fsutil import atomic_write, read_regular
from ..core.project import MAX_PYPROJECT_BYTES
from .wheel import timestamp

MAX_SOURCE_BYTES = MAX_PYPROJECT_BYTES  # pyproject.toml and the plan; an artifact is capped lower when read


def rewrite(sdist: Path, extra: dict[str, Path]) -> None:
    """Add `extra` (path inside the project -> file) under the sdist's top directory; normalise."""
    import calendar

    mtime = calendar.timegm(timestamp() + (0, 0, 0))
    members: dict[str, tuple[bytes | None, int]] = {}
    with tarfile.open(sdist, "r:gz") as tf:
        top = None
        for m in tf.getmembers():
            top = top or m.name.split("/")[0]
            if m.isdir():
                continue
            if not m.isfile():
                continue  # links in an sdist are not portable; setuptools writes none
            members[m.name] = (tf.extractfile(m).read(), 0o755 if m.mode & 0o100 else 0o644)
    for rel, path in extra.items():
        name = f"{top}/{rel}"
        if name not in members:  # a regular file, capped: a FIFO swapped in since collection fails, never hangs
            members[name] = (read_regular(path, ProjectError, MAX_SOURCE_BYTES), 0o644)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as out:
        dirs = sorted({"/".join(n.split("/")[:i]) for n in members for i in range(1, n.count("/") + 1)})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            out.addfile(info)
        for name in sorted(members):
            data, mode = members[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            out.addfile(info, io.BytesIO(data))
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0) as out:
        out.write(raw.getvalue())
    atomic_write(sdist, gz.getvalue())
