"""A directory of artifact files (`<kernel>-<address>.json`), read one way by every reader.

The runtime's FLYTUNE_ARTIFACT_DIR, `verify DIR`, `fmt`, `merge` and a tune's output all read through
here: the listing is bounded (at most `MAX_FILES` entries, one level, or core.fsutil.find's contained,
loop-free walk with `recursive`), hidden files (an atomic writer's temporaries) are not artifacts,
and every file is read by core.fsutil.read_regular (regular files only, capped at one artifact's
size): a FIFO or a link to /dev/zero named like an artifact is a problem naming it, never a hang.
A bundle directory below a walked one is a build's output, not artifacts (`within_bundle`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from . import bundle, codec, fsutil
from .errors import ArtifactError, FlytuneError, InputError

MAX_FILES = fsutil.MAX_ENTRIES
SUFFIX = ".json"


class Read(NamedTuple):
    """What `read_all` found: (path, bytes) of each file read, sorted by name, and one error per file
    (or listing) that could not be read."""
    files: list[tuple[Path, bytes]]
    problems: list[FlytuneError]


def listing(directory: str | os.PathLike, *, prefix: str = "", error=ArtifactError,
            max_files: int = MAX_FILES) -> list[Path]:
    """The artifact files directly in `directory` whose names start with `prefix`, sorted by name; an
    `error` naming the directory when it cannot be listed or holds more than `max_files` entries."""
    directory = Path(directory)
    out, seen = [], 0
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                seen += 1
                if seen > max_files:
                    raise error(f"holds more than {max_files} entries: refused", file=directory)
                if e.name.endswith(SUFFIX) and not e.name.startswith(".") and e.name.startswith(prefix):
                    out.append(directory / e.name)
    except OSError as e:
        raise error(f"cannot be listed: {e.strerror or e}", file=directory) from None
    return sorted(out, key=lambda p: p.name)


def not_a_directory(path: str | os.PathLike) -> InputError:
    """The error of a command given `path` for a directory of artifact files that it is not (`fmt`,
    `merge`, `upgrade`), saying where it does not exist at all."""
    gone = "" if os.path.lexists(path) else " (it does not exist)"
    return InputError(f"is not a directory of artifact files{gone}", file=path)


def within_bundle(root: str | os.PathLike, rel: str) -> bool:
    """Whether the file `rel` (a posix path under `root`) lies in a bundle directory (`_flytune/` holding
    a manifest): what `flytune bundle` writes into a package is a build's output, never one of its
    artifact sources, so `sources = ["src/pkg"]` does not collect `src/pkg/_flytune/` on the next run."""
    parts = rel.split("/")[:-1]
    return any(part == bundle.DIRNAME and os.path.isfile(os.path.join(root, *parts[:i + 1], bundle.MANIFEST))
               for i, part in enumerate(parts))


def read(path: str | os.PathLike, error=ArtifactError) -> bytes:
    """One artifact file's bytes: a regular file, at most one artifact's cap."""
    return fsutil.read_regular(path, error, codec.MAX_DOCUMENT_BYTES)


def read_all(directory: str | os.PathLike, *, prefix: str = "", recursive: bool = False,
             error=ArtifactError) -> Read:
    """Every artifact file of `directory` (with `recursive`, every `*.json` below it, as core.fsutil.find
    walks), each read by `read`; what cannot be listed or read is a problem, and the rest is read."""
    directory = Path(directory)
    problems: list[FlytuneError] = []
    try:
        if recursive:
            found = fsutil.find(directory, ".", suffix=SUFFIX, error=error, file=directory,
                                root_name="the directory")
            problems += found.problems
            paths = [(Path(real), directory / rel) for real, rel in sorted(found.files.items(), key=lambda t: t[1])
                     if not any(part.startswith(".") for part in Path(rel).parts)  # hidden: no artifact, as above
                     and not within_bundle(directory, rel)]
        else:
            paths = [(p, p) for p in listing(directory, prefix=prefix, error=error)]
    except FlytuneError as e:
        return Read([], [e])
    files = []
    for real, path in paths:
        try:
            files.append((path, read(real, error)))
        except FlytuneError as e:
            e.relocate(path)
            problems.append(e)
    return Read(files, problems)
