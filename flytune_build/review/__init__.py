"""`flytune report`: a bundle's tuning evidence as one self-contained HTML page, for a reviewer.

    render(source)            one source: an artifact directory, a wheel, an sdist, an installed
                              distribution (a path or name, or an `audit.source.Source` already open)
    render(old, new)          two: the second charted, the winners that changed listed and marked
    write(path, *sources)     the page written atomically; returns the path

Engine modules, data to page: `shape` (one artifact's candidates, finalists, band, measurement, all
optional), `chart` (its inline SVG), `coverage` (kernels x targets, match levels), `toolchain`
(devices and versions), `comparison` (changed winners), `page` (the document), `markup` (escaping).
Reading never imports the package, torch or triton; a source that cannot be read shows its errors.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..audit.source import Source, open_source
from ..core.errors import InputError, UsageError
from ..core.fsutil import atomic_write


def render(*sources: Source | str | os.PathLike, title: str | None = None) -> str:
    """The page for one source, or for an old and a new one."""
    if len(sources) not in (1, 2):
        raise InputError(f"takes one source or two to compare, not {len(sources)}", field="sources")
    from .page import page

    return page([s if isinstance(s, Source) else open_source(os.fspath(s)) for s in sources], title)


def write(path: str | os.PathLike, *sources: Source | str | os.PathLike, title: str | None = None) -> Path:
    """Render and write the page atomically (a reader sees the old file or the whole new one).

    Raises UsageError, writing nothing, where the page would overwrite what it reports: a SOURCE file
    itself (a wheel replaced by HTML), or a *.json under a SOURCE directory (read as an artifact next)."""
    opened = [s if isinstance(s, Source) else open_source(os.fspath(s)) for s in sources]
    check_output(path, opened)
    atomic_write(path, render(*opened, title=title).encode("utf-8"))
    return Path(path)


def check_output(path: str | os.PathLike, sources: list[Source]) -> None:
    """Raise UsageError where writing the page at `path` would destroy a source's data."""
    out = Path(path).resolve()
    for s in sources:
        if s.kind == "installed":  # a distribution name, not a path
            continue
        src = Path(s.path).resolve()
        same = out == src or (out.exists() and src.exists() and os.path.samefile(out, src))
        if same or (src.is_dir() and out.suffix == ".json" and src in out.parents):
            raise UsageError(f"is the source {s.path} itself: the page would overwrite it" if same else
                             f"is a *.json file in the source directory {s.path}: the next reading of it would "
                             f"take the page for an artifact", file=path)
