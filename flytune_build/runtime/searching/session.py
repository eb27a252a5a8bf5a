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
- `root`: the project root, importable while the session that set it is open (with the directories the
  project takes its packages from: `src/`, setuptools' `package-dir` and `packages.find.where`, ...).

Invariants: outside every session no search is checked, kept against a winner or collected, and the
settings are the process's own. A session that sets `root` also forces searching, emits nothing and
records no production miss (`settings.override(autotune="search", emit_dir=None, misses=None)`, and
`ranking` where given): a job's winners are the caller's to write. Sessions nest: an inner one is the
enclosing one with its fields replaced.

State: the open session belongs to the context that opened it (a `ContextVar`), never to the process:
two threads each running `flytune_build.tune()` have a session each, and a thread that runs none
(a serving thread) is outside every session whatever other threads tune. A thread a job starts sees
its session when it runs in the job's context (`pool.submit(contextvars.copy_context().run, fn)`);
a plain thread is outside it. `sys.path` is the one process-wide thing a session changes: each open
root is on it, followed by its package bases (`importable`, counted across threads), and the path as it
was before the first one opened comes back when the last one closes.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core import settings
from ...core.errors import ProjectError
from ...core.project import package_bases, read_pyproject


@dataclass(frozen=True)
class Session:
    shipped: Callable[[str, dict], Any] | None = None   # -> selection.Shipped | None
    check: Any = None                                   # outputs.Policy | None
    found: tuple[list, ...] = ()                        # lists of search.Found, innermost last
    root: Path | None = None


OUTSIDE = Session()
_current: contextvars.ContextVar[Session] = contextvars.ContextVar("flytune_session", default=OUTSIDE)


def current() -> Session:
    """The innermost session open in this context (OUTSIDE where none is)."""
    return _current.get()


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
            changes = {"autotune": "search", "emit_dir": None, "misses": None,
                       **({"ranking": ranking} if ranking else {})}
            stack.enter_context(settings.override(**changes))
        elif ranking is not None:
            raise TypeError("opened(ranking=...) needs root=: a ranking is set for a job's whole session")
        tokens: list = []
        stack.callback(lambda: tokens and _current.reset(tokens[0]))  # first: never open without its way out
        tokens.append(_current.set(session))
        yield session


class _Roots:
    """The project roots open on `sys.path`, across every thread: the first to open saves the path, a root
    not first on it is inserted first, its last close removes that entry (the first of its name), and the
    last close of all puts back the path as it was saved (so what a setup inserted goes too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved: list[str] | None = None
        self.open: list[str] = []
        self.inserted: set[str] = set()

    def enter(self, root: str) -> None:
        with self.lock:
            if not self.open:
                self.saved = list(sys.path)
            self.open.append(root)
            if sys.path[:1] != [root] and root not in self.inserted:
                sys.path.insert(0, root)
                self.inserted.add(root)

    def exit(self, root: str) -> None:
        with self.lock:
            self.open.remove(root)
            if not self.open:
                sys.path[:] = self.saved or []
                self.saved = None
                self.inserted.clear()
            elif root not in self.open and root in self.inserted:
                self.inserted.discard(root)
                if root in sys.path:
                    sys.path.remove(root)


_roots = _Roots()


@contextlib.contextmanager
def importable(root: Path) -> Iterator[None]:
    """A block in which modules under `root` import, and the packages of its src/ (or other package-base)
    layout: `root` is on `sys.path`, first when it opened, then each of `bases(root)`; once no block of
    any thread is open, `sys.path` is as it was before the first opened."""
    paths = [str(root), *bases(root)]
    with contextlib.ExitStack() as stack:
        for path in reversed(paths):  # each enters first: the root ends up before its bases
            _roots.enter(path)
            stack.callback(_roots.exit, path)
        yield


PLACEHOLDER = "_"  # a top-level name no `package-dir` maps on its own: `package_bases` gives the base directories


def bases(root: Path) -> list[str]:
    """The directories other than `root` that the project at `root` takes its top-level packages from, as
    `core.project.package_bases` reads its pyproject.toml (`src/`, setuptools' `package-dir` and
    `packages.find.where`, hatchling's, maturin's, pdm's): those that exist. None where pyproject.toml
    cannot be read or parsed (its own command reports that). A package mapped to a directory of its own
    (`package-dir = {mylib = "lib"}`) is not importable from any directory: `pip install -e .` makes it so."""
    try:
        doc = read_pyproject(root)
    except ProjectError:
        return []
    top = os.path.realpath(root)
    found = [os.path.dirname(p) for p in package_bases(Path(root), doc, PLACEHOLDER)]
    return [d for d in dict.fromkeys(os.path.normpath(d) for d in found)
            if os.path.realpath(d) != top and os.path.isdir(d)]
