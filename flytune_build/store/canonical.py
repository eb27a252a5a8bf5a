"""Artifact directories in canonical form (`flytune fmt DIR...`): rewrite artifact files in canonical form under their content address.

All or nothing: every file of every directory is read first (regular files only, capped: a FIFO
named like an artifact is an error, not a hang) and checked; two files that are one identity to the
runtime (core.verification's rule, the build's) with different configs are a conflict naming both.
Any error, and nothing is rewritten. Then each target is written atomically, and only then is any
source that is not a target removed (names may overlap in any order: nothing read is lost); an exact duplicate
(same identity, same config) is folded into one file. A file replaced or removed must still hold the bytes
read from it (`fsutil.unchanged`, `fsutil.remove_unchanged`): one changed meanwhile is left as it is, named.
A run interrupted while it rewrites (Ctrl-C, a kill) loses nothing but is not undone: each file is then
its original, its canonical copy, or both (one identity, one config), and running `fmt` again finishes.
"""
from __future__ import annotations

import os

from dataclasses import dataclass, field
from pathlib import Path

from ..core import arguments, artifactdir, fsutil, verification
from ..core.artifact import Artifact
from ..core.errors import FlytuneError, InputError, OutputError, printable


@dataclass
class Formatted:
    """What `fmt` did: `errors` non-empty means nothing was rewritten."""
    errors: list[FlytuneError]
    actions: list[str] = field(default_factory=list)   # one line per file rewritten or removed

    @property
    def ok(self) -> bool:
        return not self.errors


def fmt(paths) -> Formatted:
    """Rewrite the artifact files of the directories `paths` canonically under their content address:
    all or nothing (any error, and nothing is rewritten). InputError for a path that is no directory."""
    paths = arguments.paths(paths, "paths")  # fmt("AB") would rewrite A and B
    for given in paths:  # every input checked before anything is rewritten
        if not Path(given).is_dir():
            raise artifactdir.not_a_directory(given)
    directories = list(dict.fromkeys(Path(d).resolve() for d in paths))  # a directory named twice: once
    plans, errors = [], []
    for d in directories:
        plan, problems = read_directory(d)
        plans.append(plan)
        errors += problems
    for plan in plans if not errors else ():  # a file changed since it was read: nothing is rewritten
        errors += unchanged(plan)
    report = Formatted(errors)
    if not errors:
        for plan in plans:
            report.actions += rewrite(plan, report.errors)
    return report


def unchanged(plan: Plan) -> list[FlytuneError]:
    """An OutputError for each file `rewrite` would replace or remove that no longer holds the bytes read."""
    out = []
    for path in {*plan.targets, *plan.current}:
        if path in plan.targets and plan.current.get(path) == plan.targets[path][1].to_bytes():
            continue  # already canonical: neither replaced nor removed
        try:
            fsutil.unchanged(path, plan.current.get(path))
        except OutputError as e:
            out.append(e)
    return sorted(out, key=lambda e: e.file or "")


def rewrite(plan: Plan, errors: list[FlytuneError]) -> list[str]:
    """Write every target, then remove every source that is not one: whatever order the names overlap
    in (a misnamed file may hold another's address), no artifact read is lost; a file that changed since
    it was read is neither replaced nor removed (an OutputError in `errors`). Returns a line per file changed."""
    actions, moved = [], set()
    for target, (source, art) in plan.targets.items():
        if plan.current.get(target) != art.to_bytes():
            try:
                fsutil.unchanged(target, plan.current.get(target))  # checked again: the nearest to replacing
                art.save(target.parent)
            except OutputError as e:
                errors.append(e)
                continue
            moved.add(source)
            actions.append(f"rewrote {printable(str(source))} -> {target.name}")
    for source in plan.current:
        if source in plan.targets:
            continue
        try:
            fsutil.remove_unchanged(source, plan.current[source])
        except OutputError as e:
            errors.append(e)
            continue
        if source not in moved:
            actions.append(f"removed {printable(str(source))}: its artifact is {plan.kept_as[source].name}")
    return actions


@dataclass
class Plan:
    """One directory's files as read (path -> bytes) and what they become (target path -> (source, artifact))."""
    current: dict[Path, bytes] = field(default_factory=dict)
    targets: dict[Path, tuple[Path, Artifact]] = field(default_factory=dict)
    kept_as: dict[Path, Path] = field(default_factory=dict)  # each source -> the file its artifact ends up in


def read_directory(directory: Path) -> tuple[Plan, list[FlytuneError]]:
    """Every `*.json` of `directory` read and parsed, its plan, and the problems: unreadable or invalid
    files, and identities that conflict (two files one would overwrite with the other)."""
    found, origin, plan = [], {}, Plan()
    files, errors = artifactdir.read_all(directory)  # bounded listing, capped regular-file reads
    links = {path for path, _ in files if path.is_symlink()}
    errors += [InputError(f"is a symbolic link (to {os.readlink(path)}): `fmt` rewrites files in place and would "
                          f"replace the link with a file; put the file itself here", file=path) for path in sorted(links)]
    for path, data in files:
        if path in links:
            continue
        try:
            art = Artifact.from_bytes(data, file=path, check_name=False)
        except FlytuneError as e:
            errors.append(e)
            continue
        found.append((path, art))
        plan.current[path] = data
        origin[id(art)] = str(path)
    findings = verification.conflicts([a for _, a in found], lambda a: origin[id(a)])
    kept = {id(a) for a in findings.kept(a for _, a in found)}
    final: dict[str, Path] = {}  # runtime identity -> its file
    for path, art in found:
        if id(art) in kept:
            target = path.with_name(art.filename)
            plan.targets[target] = (path, art)
            final[verification.runtime_identity(art)] = target
    for path, art in found:
        plan.kept_as[path] = final.get(verification.runtime_identity(art), path)
    return plan, errors + findings.errors
