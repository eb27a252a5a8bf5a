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
from ..core.errors import InputError
from ..core.fsutil import atomic_write


def render(*sources: Source | str | os.PathLike, title: str | None = None) -> str:
    """The page for one source, or for an old and a new one."""
    if len(sources) not in (1, 2):
        raise InputError(f"takes one source or two to compare, not {len(sources)}", field="sources")
    from .page import page

    return page([s if isinstance(s, Source) else open_source(os.fspath(s)) for s in sources], title)


def write(path: str | os.PathLike, *sources: Source | str | os.PathLike, title: str | None = None) -> Path:
    """Render and write the page atomically (a reader sees the old file or the whole new one)."""
    atomic_write(path, render(*sources, title=title).encode("utf-8"))
    return Path(path)
