"""A tuning session: what every search that runs inside `flytune tune` (or a harvest) is asked, and
where its results go, as one typed value.

A search starts deep inside user code (a plan's setup calls the kernel; the kernel's first call at a
key searches), so what a job asks of it cannot travel as an argument. It is the current `Session`
instead: entered with `opened(...)` around the job, read by the search where each field is needed,
and the enclosing one back on exit, whatever the block raised:

- `shipped`: `(kernel, key) -> selection.Shipped | None`, the output's winner a search must beat
  (hysteresis; None: no winner held);
- `check`: an `outputs.Policy`, how each candidate's outputs are checked (None: unchecked);
- `found`: the lists every search that ends inside appends its `search.Found` to: the session's own
  (`opened(collect=True)`) and every enclosing one's;
- `root`: the project root, importable while the session that set it is open.

Invariants: outside every session no search is checked, kept against a winner or collected, and the
settings are the process's own. A session that sets `root` also forces searching and emits nothing
(`settings.override(autotune="search", emit_dir=None)`, and `ranking` where given): a job's winners
are the caller's to write. Sessions nest: an inner one is the enclosing one with its fields replaced.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import settings


@dataclass(frozen=True)
class Session:
    shipped: Callable[[str, dict], Any] | None = None   # -> selection.Shipped | None
    check: Any = None                                   # outputs.Policy | None
    found: tuple[list, ...] = ()                        # lists of search.Found, innermost last
    root: Path | None = None


OUTSIDE = Session()
_open: list[Session] = []


def current() -> Session:
    """The innermost open session (OUTSIDE where none is)."""
    return _open[-1] if _open else OUTSIDE


@contextlib.contextmanager
def opened(*, collect: bool = False, ranking: str | None = None, **fields: Any) -> Iterator[Session]:
    """A session: the current one with `fields` replaced (`shipped`, `check`, `root`), and with
    `collect` a `found` list of its own (the yielded session's `found[-1]`). `ranking` (with `root`
    only): the ranking its searches use, where not the settings'."""
    base = current()
    session = dataclasses.replace(base, **fields, found=base.found + (([],) if collect else ()))
    with contextlib.ExitStack() as stack:
        if "root" in fields:
            stack.enter_context(importable(session.root))
            changes = {"autotune": "search", "emit_dir": None, **({"ranking": ranking} if ranking else {})}
            stack.enter_context(settings.override(**changes))
        elif ranking is not None:
            raise TypeError("opened(ranking=...) needs root=: a ranking is set for a job's whole session")
        stack.callback(_close, session)   # first: a session is never open without its way out
        _open.append(session)
        yield session


@contextlib.contextmanager
def importable(root: Path) -> Iterator[None]:
    """A block in which modules under `root` import (it is first on `sys.path`); `sys.path` is as it
    was on exit."""
    saved = list(sys.path)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path[:] = saved


def _close(session: Session) -> None:
    for i in range(len(_open) - 1, -1, -1):  # by identity: two sessions may hold equal fields
        if _open[i] is session:
            del _open[i]
            return
