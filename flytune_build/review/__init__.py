"""`flytune report`: a bundle's tuning evidence as one self-contained HTML page, for a reviewer.

    render(source)            one source: an artifact directory, a wheel, an sdist, an installed
                              distribution (a path or name, or an `audit.source.Source` already open)
    render(old, new)          two: the second charted, the winners that changed listed and marked
    write(path, *sources)     the page written atomically; returns the path (never over a source, nor
                              over a file that is not a page `report` wrote: `check_output`)

Engine modules, data to page: `shape` (one artifact's candidates, finalists, band, measurement, all
optional), `chart` (its inline SVG), `coverage` (kernels x targets, match levels), `toolchain`
(devices and versions), `comparison` (changed winners), `page` (the document), `markup` (escaping).
Reading never imports the package, torch or triton; a source that cannot be read shows its errors.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..audit.source import Source, open_source
from ..core import arguments, fsutil
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

    Raises UsageError, before any source is read and writing nothing, where the page would replace what it
    does not own (`check_output`)."""
    path = arguments.path(path, "path")
    check_output(path, sources)
    opened = [s if isinstance(s, Source) else open_source(os.fspath(s)) for s in sources]
    atomic_write(path, render(*opened, title=title).encode("utf-8"))
    return Path(path)


def check_output(path: str | os.PathLike, sources) -> None:
    """Raise UsageError where writing the page at `path` would destroy what it reads or anything else: the
    page is never a SOURCE file (a wheel replaced by HTML), never a *.json under a SOURCE directory (read as
    an artifact next), and never replaces an existing file that is not a page `report` wrote (its head holds
    `page.MARK`): a project's pyproject.toml, its tuning plan, its .flytune-tune-state stay as they are."""
    from .page import MARK

    named = [s.path if isinstance(s, Source) else os.fspath(s) for s in sources
             if not (isinstance(s, Source) and s.kind == "installed")]
    found = fsutil.overlap(path, [p for p in named if os.path.lexists(p)])  # a name that is no path: installed
    if found is not None and (found[1] == "is" or (found[1] == "is inside" and Path(path).suffix == ".json")):
        given, how = found
        raise UsageError(f"is the source {given} itself: the page would overwrite it" if how == "is" else
                         f"is a *.json file in the source directory {given}: the next reading of it would "
                         f"take the page for an artifact", file=path)
    if os.path.lexists(path):
        top = fsutil.head(path, 1024)
        if top is None or (top and not (top.startswith(b"<!DOCTYPE html>") and MARK.encode() in top)):  # b"": mktemp's
            raise UsageError("exists and is not a page `flytune report` wrote: the page never replaces another "
                             "file; pass a new file name (or remove the file first, if it is yours to lose)",
                             file=path)
