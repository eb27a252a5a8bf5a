"""The audit engine: wheels, sdists, project or artifact directories and installed distributions read
without a GPU and without importing the package (unless deep), judged by the build's own rules
(`core.verification`). `flytune verify`, `inspect` and `diff` are one caller of these functions."""
from __future__ import annotations

from ..core import arguments
from .source import Source, open_source

__all__ = ["verify", "inspect", "diff", "open_source", "Source"]


def verify(path, *, strict: bool = False, deep: bool = False, execute: bool = False) -> Source:
    """The bundle at `path` as read and checked: `.ok`, `.errors` (typed, with file, field and rule),
    `.warnings`, `.artifacts`. `deep` imports the package the source itself declares and checks each
    artifact against its kernel; `execute` also runs each one that matches this device. Prints nothing."""
    from . import source

    strict, deep, execute = (arguments.flag(v, n) for v, n in ((strict, "strict"), (deep, "deep"), (execute, "execute")))
    return source.verify(str(arguments.path(path, "path")), strict=strict, deep=deep, execute=execute)


def inspect(path) -> dict:
    """Coverage (kernels x targets), key axes, toolchain and sizes of the bundle at `path`, as data
    (the document `flytune inspect --json` prints, less its "format")."""
    from . import inspection, source

    return inspection.inspect(source.open_source(str(arguments.path(path, "path"))))


def diff(old, new) -> dict:
    """Identities added, removed and with a changed winner (by how much) between two bundles."""
    from . import inspection, source

    return inspection.diff(source.open_source(str(arguments.path(old, "old"))),
                           source.open_source(str(arguments.path(new, "new"))))
