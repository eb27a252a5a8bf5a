"""`flytune upgrade DIR`: rewrite an artifact directory that several releases wrote into one form.

What changes is only what `core.verification.conform` reads in: an artifact written before null key
axes (the first release left an adopted kernel's None arguments out of its key) gains the null axes
its kernel's other artifacts hold, under its new content address, in its own folder. DIR is read as
the build and `verify DIR` read it, every folder below it (`artifacts/` of a tune's `{arch}` layout,
whose re-tunes on one device decide the axes of the first release's files on another). Its config and provenance are kept
as they are; nothing else is rewritten. Lossless: both keys stand for one Triton cache key.

All or nothing: every file is read and the directory checked with the build's rules first (key
axes, conflicts, backend options); any error, and nothing is written. A target that already holds
the same identity and config with other provenance (the shape re-tuned by a newer release) is left to
the user: remove the file whose measurement to drop (two configs are a conflict the rules already
name). Then every target is written atomically (one that fails removes those written), and only then
are the old files removed, each only while it still holds the bytes read from it (one changed meanwhile
is kept and named: nothing is written when that is found before the writing).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core import artifactdir, fsutil, verification
from ..core.artifact import Artifact
from ..core.errors import ArtifactError, FlytuneError, InputError, OutputError, printable


@dataclass
class Upgraded:
    """What `upgrade` did: `errors` non-empty means nothing was written."""
    errors: list[FlytuneError] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)   # one line per file rewritten
    files: int = 0                                     # artifact files read

    @property
    def ok(self) -> bool:
        return not self.errors


def upgrade(directory) -> Upgraded:
    """Rewrite the artifacts of `directory` under each kernel's one axis set (see the module docstring)."""
    root = Path(directory)
    if not root.is_dir():
        raise artifactdir.not_a_directory(directory)
    report = Upgraded()
    found: list[tuple[Path, Artifact]] = []
    read = artifactdir.read_all(root, recursive=True)  # contained, bounded, regular files only (as verify DIR)
    report.errors += read.problems
    read_bytes = dict(read.files)
    for path, data in read.files:
        try:
            found.append((path, Artifact.from_bytes(data, file=path)))
        except FlytuneError as e:
            report.errors.append(e)
    report.files = len(found)
    if report.errors:
        return report
    origin = {id(a): str(p) for p, a in found}
    checked = verification.check([a for _, a in found], lambda a: origin[id(a)])
    report.errors += checked.errors
    if report.errors:
        return report
    plan = []  # (old path, new artifact)
    planned: dict[Path, tuple[Path, Artifact]] = {}  # target -> the old file it is made from
    for (path, art), new in zip(found, verification.conformed([a for _, a in found])):
        if new is art:
            continue
        target = path.parent / new.filename
        if target in planned:  # two old files, one identity and config: one file would be lost
            first_path, first = planned[target]
            if first.to_bytes() != art.to_bytes():
                report.errors.append(ArtifactError(
                    f"and {first_path.name} are, with the null axes they lack, both {new.filename}, "
                    f"with other provenance: one measurement would be dropped: remove the file whose measurement "
                    f"you drop, then upgrade", file=path, field="key"))
                continue
        planned.setdefault(target, (path, art))
        if os.path.lexists(target) and (target.is_symlink() or not target.is_file()
                                        or artifactdir.read(target) != new.to_bytes()):
            report.errors.append(ArtifactError(
                f"is, with the null axes it lacks, the identity of {target.name}, which holds its config with "
                f"another provenance (this shape re-tuned by a newer release?): remove the file whose "
                f"measurement you drop, then upgrade",
                file=path, field="key"))
            continue
        plan.append((path, new))
    if report.errors:
        return report
    _write(plan, read_bytes, report)
    return report


def _write(plan: list[tuple[Path, Artifact]], read_bytes: dict[Path, bytes], report: Upgraded) -> None:
    """Every planned file written, then each old one removed while it holds the bytes read from it."""
    changed = []
    for path, _ in plan:  # a source changed since it was read: nothing is written
        try:
            fsutil.unchanged(path, read_bytes[path])
        except OutputError as e:
            changed.append(e)
    if changed:
        report.errors += changed
        return
    try:  # every new file, or (one failing) none
        fsutil.write_all([(path.parent / new.filename, new.to_bytes()) for path, new in plan
                          if not (path.parent / new.filename).exists()])
    except FlytuneError as e:
        report.errors.append(e)
        return
    for path, new in plan:
        try:  # only while it holds what was read: a change made meanwhile is kept, never lost
            fsutil.remove_unchanged(path, read_bytes[path])
        except OutputError as e:  # both files stay: one identity, one config (verify notes the duplicate)
            report.errors.append(OutputError(f"cannot be removed after {new.filename} was written: {e.rule}",
                                             file=path))
            continue
        report.actions.append(f"upgraded {printable(str(path))} -> {new.filename}")
