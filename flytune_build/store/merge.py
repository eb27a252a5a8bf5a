"""`flytune merge DIR... --output OUT [--prefer faster|newer]`: the union of artifact directories
tuned on different machines.

Artifacts are matched by identity (kernel, key, device: the content address in the file name). One
identity with one config is one artifact: the first directory's, in the order given. One identity with
different configs is a conflict, listed with each file, its winner and the winner's time, and nothing
is written (exit 1), unless `--prefer` names the rule that decides:

    faster   the lower time of the winner, as its own provenance measured it (its candidate entry)
    newer    the later `provenance.created`

A rule that cannot decide (a time or timestamp missing, a tie) leaves the conflict. Rankings never mix:
a synthetic artifact's "time" is a rank, so `faster` never compares it with a measured (or imported)
one; such an identity stays a conflict, listed with each file's ranking, and `newer` (or removing one
side) decides it. The union is
written into a new directory beside OUT and renamed into place, so OUT holds what it held before or
the whole union, never part of it. OUT must not exist, be empty, or be one of the DIRs (merge into it:
everything else it holds, files, folders and links, stays as it was).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import arguments, artifactdir, codec, fsutil, serving
from ..core.artifact import Artifact
from ..core.errors import InputError, UsageError

PREFER = ("faster", "newer")
CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
RENAME_EXCHANGE = 2


@dataclass
class Found:
    path: Path
    artifact: Artifact
    data: bytes

    def winner_ms(self) -> float | None:
        """The winner's own time in its provenance (None: not recorded)."""
        return serving.config_time(self.artifact.provenance, self.artifact.config.to_json())

    def created(self) -> str | None:
        """`provenance.created` as flytune writes it (UTC, `%Y-%m-%dT%H:%M:%SZ`, which sorts as text);
        None when absent or in any other form: `--prefer newer` does not guess what it means."""
        value = (self.artifact.provenance or {}).get("created")
        if not isinstance(value, str) or not CREATED.fullmatch(value):
            return None
        try:
            time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:  # a 13th month, a 61st second
            return None
        return value

    def ranking(self) -> str | None:
        value = (self.artifact.provenance or {}).get("ranking")
        return value if isinstance(value, str) else None

    def synthetic(self) -> bool:
        return self.ranking() == "synthetic"

    def describe(self) -> str:
        t = self.winner_ms()
        if self.synthetic():
            return (f"{self.path}: {self.artifact.config}, winner rank {'-' if t is None else f'{t:.4f}'} "
                    f"(synthetic), created {self.created() or '-'}")
        return (f"{self.path}: {self.artifact.config}, winner time "
                f"{'-' if t is None else f'{t:.4f} ms'}, created {self.created() or '-'}")


def read(dirs: list[Path]) -> dict[str, list[Found]]:
    """Every artifact of every directory, by content address, in the order given."""
    by_address: dict[str, list[Found]] = {}
    for d in dirs:
        if not d.is_dir():
            raise artifactdir.not_a_directory(d)
        for path in artifactdir.listing(d):  # bounded; each file read capped, regular files only
            data = artifactdir.read(path)
            art = Artifact.from_bytes(data, file=path)
            by_address.setdefault(art.address, []).append(Found(path, art, data))
    return by_address


def choose(found: list[Found], prefer: str | None) -> tuple[Found | None, str | None]:
    """(the artifact kept, why when a rule chose it); (None, why not) for a conflict."""
    configs = {codec.canonical(f.artifact.config.to_json()) for f in found}
    if len(configs) == 1 and prefer is None:
        return found[0], None
    if prefer is None:
        return None, "different winners"
    if prefer == "faster" and len({f.synthetic() for f in found}) > 1:
        return None, ("--prefer faster: a synthetic rank and a measured time cannot be compared "
                      "(rankings never mix; --prefer newer, or remove one side)")
    values = [(f.winner_ms() if prefer == "faster" else f.created(), f) for f in found]
    if any(v is None for v, _ in values):
        return (found[0], None) if len(configs) == 1 else (None, f"--prefer {prefer}: a {_what(prefer)} is missing")
    best = min(v for v, _ in values) if prefer == "faster" else max(v for v, _ in values)
    top = [f for v, f in values if v == best]
    if len({codec.canonical(f.artifact.config.to_json()) for f in top}) > 1:
        return None, f"--prefer {prefer}: a tie"
    if prefer == "faster":
        return top[0], (f"{prefer}: rank {best:.4f} (synthetic)" if top[0].synthetic() else f"{prefer}: {best:.4f} ms")
    return top[0], f"{prefer}: {best}"


def _what(prefer: str) -> str:
    return "winner time" if prefer == "faster" else "provenance.created (UTC, YYYY-MM-DDTHH:MM:SSZ)"


def write(chosen: list[Found], output: Path, inputs: list[Path]) -> None:
    """All of `chosen` in `output`, at once (a directory renamed into place)."""
    output = _through_link(output.absolute())
    into_input = output.exists() and any(output.resolve() == d.resolve() for d in inputs)
    if output.exists() and not output.is_dir():
        raise fsutil.not_a_directory(output)
    if output.exists() and not into_input and any(output.iterdir()):
        raise InputError("exists and is not empty; merge into a new directory, or list it among the DIRs "
                           "to merge into it", file=output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{output.name}.merge-", dir=output.parent))
    except OSError as e:
        raise InputError(f"cannot be written: {e.strerror or e}", file=output) from None
    moved: list[str] = []  # what else OUT held, moved into `staged` (back into OUT if the swap fails)
    try:
        for f in chosen:
            _write_file(staged / f.artifact.filename, f.data)
        os.chmod(staged, 0o755)
        if into_input:  # keep whatever else it holds (a tune state, notes, folders, links), then swap
            union = {f.artifact.filename for f in chosen}
            for other in sorted(output.iterdir()):
                if other.name not in union:  # every artifact file of OUT was read: its address is in the union
                    os.rename(other, staged / other.name)
                    moved.append(other.name)
            _exchange(staged, output)
            moved.clear()
        else:
            os.replace(staged, output)  # a new or empty directory: replaced whole
    except OSError as e:
        raise InputError(f"cannot be written: {e.strerror or e}", file=output) from None
    finally:
        for name in moved:
            os.rename(staged / name, output / name)
        shutil.rmtree(staged, ignore_errors=True)


def _through_link(output: Path) -> Path:
    """The directory a symlink OUT points to, written through (the link stays, pointing where it did; a
    merge never replaces it, nor moves its target's files out from under it); OUT itself when no link."""
    if not output.is_symlink():
        return output
    try:
        target = output.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        raise InputError("is a symbolic link to no directory; merge into the directory itself", file=output) from None
    if not target.is_dir():
        raise InputError(f"is a symbolic link to {target}, which is not a directory", file=output)
    return target


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, 0o644)


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories: at once where Linux's renameat2 can, else by two renames."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "renameat2", None)
        if fn is not None and fn(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) == 0:  # AT_FDCWD
            return
    aside = a.with_name(a.name + ".old")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


@dataclass
class Merged:
    """What `merge` found and did: nothing is written while `conflicts` holds anything."""
    chosen: list[Found]
    conflicts: list[tuple[list[Found], str]]          # (the files of one identity, why they differ)
    decided: list[tuple[Found, list[Found], str]]     # (kept, all of that identity, by which rule)
    duplicates: int
    written: bool

    @property
    def ok(self) -> bool:
        return not self.conflicts


def merge(dirs, output, *, prefer: str | None = None) -> Merged:
    """The union of the artifact directories `dirs` in `output` (new, empty, or one of `dirs`): all or
    nothing. Identities with different winners are conflicts (nothing is written) unless `prefer`
    (faster | newer) decides them. InputError/ArtifactError for a missing directory or invalid file."""
    dirs = [Path(d) for d in arguments.paths(dirs, "dirs")]  # merge("AB", out) would merge A and B
    if not dirs:   # an empty union would still make `output`
        raise UsageError("is empty: name at least one artifact directory to merge", field="dirs")
    output = arguments.path(output, "output")
    if prefer is not None and prefer not in PREFER:
        raise InputError(f"prefer must be one of {', '.join(PREFER)}, not {prefer!r}")
    by_address = read(dirs)
    chosen, conflicts, decided, duplicates = [], [], [], 0
    for address in sorted(by_address, key=lambda a: by_address[a][0].artifact.filename):
        found = by_address[address]
        duplicates += len(found) - 1
        keep, why = choose(found, prefer)
        if keep is None:
            conflicts.append((found, why))
        else:
            chosen.append(keep)
            if why and len({codec.canonical(f.artifact.config.to_json()) for f in found}) > 1:
                decided.append((keep, found, why))
    if not conflicts:
        write(chosen, Path(output), dirs)
    return Merged(chosen, conflicts, decided, duplicates, not conflicts)
