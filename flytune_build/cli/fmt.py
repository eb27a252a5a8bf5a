"""`flytune fmt DIR...`: rewrite artifact files in canonical form under their content address.

All or nothing: every file of every directory is read first (regular files only, capped: a FIFO
named like an artifact is an error, not a hang) and checked; two files that are one identity to the
runtime (core.verification's rule, the build's) with different configs are a conflict naming both.
Any error, and nothing is rewritten. Then each file is rewritten atomically; an exact duplicate
(same identity, same config) is folded into one file.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..core import codec, verification
from ..core.artifact import Artifact
from ..core.errors import ArtifactError, FlytuneError, InputError
from ..core.fsutil import read_regular
from .audit import escape

EXIT_OK, EXIT_VIOLATIONS = 0, 1


def command(args) -> int:
    for d in args.paths:  # every input checked before anything is rewritten
        if not Path(d).is_dir():
            raise InputError("is not a directory of artifact files", file=d)
    planned: list[tuple[Path, bytes, Artifact]] = []
    errors: list[FlytuneError] = []
    for d in args.paths:
        found, problems = read_directory(Path(d))
        planned += found
        errors += problems
    for e in errors:
        print(f"flytune: error: {escape(str(e))}", file=sys.stderr)
    if errors:
        print(f"flytune: {len(errors)} problem(s); nothing was rewritten", file=sys.stderr)
        return EXIT_VIOLATIONS
    changed = 0
    for path, data, art in planned:
        canonical = art.to_bytes()
        target = path.with_name(art.filename)
        if target != path or data != canonical:
            art.save(path.parent)
            if target != path:
                path.unlink()
            changed += 1
            print(f"rewrote {escape(str(path))} -> {target.name}")
    print(f"flytune: {changed} file(s) rewritten")
    return EXIT_OK


def read_directory(directory: Path) -> tuple[list[tuple[Path, bytes, Artifact]], list[FlytuneError]]:
    """Every `*.json` of `directory` read and parsed, and the problems: unreadable or invalid files,
    and identities that conflict (two files one would overwrite with the other)."""
    found, errors, origin = [], [], {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = read_regular(path, ArtifactError, codec.MAX_DOCUMENT_BYTES)
            art = Artifact.from_bytes(data, file=path, check_name=False)
        except FlytuneError as e:
            errors.append(e)
            continue
        found.append((path, data, art))
        origin[id(art)] = str(path)
    conflicts = verification.conflicts([a for _, _, a in found], lambda a: origin[id(a)])
    return found, errors + conflicts.errors
