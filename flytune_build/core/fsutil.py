"""Files read and written safely, for every layer.

- `atomic_write`: a reader sees the old file or the new one, never half of either; `write_all`: a set of
  files, all or none.
- `apart`: an output never is, lies inside or holds what its command reads (`overlap`).
- `read_regular`: opened without blocking (a FIFO does not hang the caller), checked to be a regular
  file after opening (a link to /dev/zero is refused, not read forever), read up to a cap.
- `find`: the files a path or glob reaches under a root, walked without leaving the root (each
  symlink resolved and contained), without looping (directories known by (st_dev, st_ino)), without
  following a glob into combinatorial work, and bounded in entries and depth.
- `one_file`: the name under which two file names are one file on macOS (and, told apart by case
  only, on Windows).
"""
from __future__ import annotations

import errno
import fnmatch
import os
import stat
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from .errors import OutputError, UsageError

MAX_ENTRIES = 1_000_000  # directory entries one source may visit
MAX_DEPTH = 64           # directory levels below the root
_OPEN = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)
_MAGIC = frozenset("*?[")


def one_file(name: str) -> str:
    """`name` as macOS's file systems see it (APFS and HFS+ by default ignore case and Unicode form; NTFS
    ignores case): two names with the same `one_file` are one file there, so one of the two is lost. Case
    is mapped one letter to one letter, as those file systems map it (`lower`, not `casefold`: ß is not ss)."""
    return unicodedata.normalize("NFD", name).lower()


MAKE_PARENT_TRIES = 3   # a parent removed meanwhile by another process is made again, this often


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temporary file and a rename: a reader sees the old file or
    the new one. Any failure is an OutputError naming `path` (an OSError too), with nothing left. A
    parent directory made here and removed by another process before the temporary file is in it (a
    tuning run removing the empty folders it made) is made again."""
    path = Path(path)
    tmp = None
    try:
        for attempt in range(MAKE_PARENT_TRIES):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir() and not path.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way")
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                break
            except FileNotFoundError:
                if attempt == MAKE_PARENT_TRIES - 1:
                    raise
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(f"cannot be written: {e.strerror or e}", file=path) from None
        raise


def write_all(files: list[tuple[Path, bytes]], previous: dict | None = None) -> None:
    """Write each (path, bytes) with `atomic_write`, all or none: when one fails or the write is interrupted
    (an OutputError naming it, or whatever stopped it, is raised), those already written by this call are
    removed, and a path in `previous` (path -> the bytes the caller read from it) is put back as it was.
    Any other path that existed before is the caller's to leave alone."""
    previous = {Path(p): data for p, data in (previous or {}).items()}
    written: list[Path] = []
    try:
        for path, data in files:
            atomic_write(path, data)
            written.append(Path(path))
    except BaseException:
        for path in written:
            try:
                if path in previous:
                    atomic_write(path, previous[path])
                else:
                    os.unlink(path)
            except OSError:
                pass
        raise


def head(path: str | os.PathLike, size: int) -> bytes | None:
    """The first `size` bytes of the regular file at `path` (links followed), opened without blocking; None
    for anything else (missing, unreadable, a FIFO, a device, a directory)."""
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        return os.read(fd, size) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def overlap(output: str | os.PathLike, inputs) -> tuple[str, str] | None:
    """(the first of `inputs` that `output` is, lies inside, or holds as one of its own files; that relation
    in words: "is", "is inside", "holds"), or None where the output is apart from every input. An input
    further down (`--output .` beside `dist/x.whl` or `arts/`) is apart: what is written into the output
    neither replaces nor mixes with it. Links are resolved, and two names of one file (a hard link, another
    case on macOS) are one."""
    out = os.path.realpath(output)
    for given in inputs:
        real = os.path.realpath(given)
        if out == real or (os.path.exists(out) and os.path.exists(real) and os.path.samefile(out, real)):
            return os.fspath(given), "is"
        if out.startswith(real.rstrip(os.sep) + os.sep):
            return os.fspath(given), "is inside"
        if os.path.dirname(real) == out.rstrip(os.sep) and not os.path.isdir(real):
            return os.fspath(given), "holds"
    return None


def apart(output: str | os.PathLike, inputs, *, flag: str = "--output") -> None:
    """A UsageError naming `output` where it is, lies inside or holds one of `inputs` (what the command
    reads): a command never writes into what it reads, where its output would replace or mix with it."""
    found = overlap(output, inputs)
    if found is not None:
        given, how = found
        raise UsageError(f"{how} the input {given}: the output would replace or mix with what the command reads; "
                         f"pass a {flag} apart from every input (not it, not inside it, not holding it)", file=output)


def walk_root(root: str | os.PathLike, pattern: str) -> Path:
    """Where `find(root, pattern)` starts walking: `root` joined with the pattern's segments before its
    first glob (`artifacts/*/x` -> root/artifacts); every file it reaches lies under it."""
    segs = [s for s in pattern.replace("\\", "/").split("/") if s not in ("", ".")]
    plain = []
    for seg in segs:
        if _MAGIC & set(seg):
            break
        plain.append(seg)
    return Path(root, *plain)


def holds(path: str | os.PathLike, data: bytes | None) -> bool:
    """Whether `path` holds exactly `data` (a regular file, read capped just past it); with `data` None,
    whether nothing is there at all."""
    if data is None:
        return not os.path.lexists(path)
    try:
        return read_regular(path, OutputError, len(data) + 1) == data
    except (OSError, OutputError):
        return False


def unchanged(path: str | os.PathLike, data: bytes | None) -> None:
    """Raise an OutputError naming `path` unless it still holds `data`, the bytes read from it (None: it did
    not exist): a writer that replaces or removes what it read checks first, so a change made meanwhile is
    refused, never overwritten or lost."""
    if not holds(path, data):
        raise OutputError("changed after it was read (another writer?); it is left as it is: run again"
                          if data is not None else
                          "appeared after the directory was read (another writer?); it is left as it is: run again",
                          file=path)


def remove_unchanged(path: str | os.PathLike, data: bytes) -> None:
    """Remove `path` only while it holds `data`, the bytes read from it. It is renamed aside first (a writer
    opening the name meanwhile makes a new file) and compared there: a file that changed is put back (or,
    when its name was taken meanwhile, left beside it) and an OutputError names it."""
    path = Path(path)
    unchanged(path, data)
    aside = path.with_name(f".{path.name}.{os.getpid()}.removing")
    try:
        os.rename(path, aside)
    except OSError as e:
        raise OutputError(f"cannot be removed: {e.strerror or e}", file=path) from None
    if holds(aside, data):
        os.unlink(aside)
        return
    try:
        os.link(aside, path)  # back under its name, unless a new file took it (link never replaces)
        os.unlink(aside)
        where = "it is left as it is"
    except OSError:
        where = f"it is kept as {aside.name}"
    raise OutputError(f"changed after it was read (another writer?); {where}: run again", file=path)


def output_directory(path: str | os.PathLike) -> Path:
    """`path`, made a directory if it is not one, and written once (a file made and removed: a directory
    that exists but cannot take a file, read-only or full, is found before any work, not after it); an
    OutputError naming it when it cannot be."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):   # it, or a folder above it, is something else
        blocker = next((p for p in (path, *path.parents) if os.path.lexists(p) and not p.is_dir()), path)
        raise not_a_directory(path, blocker) from None
    except OSError as e:
        raise OutputError(f"cannot be an output directory: {e.strerror or e}", file=path) from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".flytune-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot be an output directory: a file cannot be written in it ({e.strerror or e})",
                          file=path) from None
    return path


def not_a_directory(path: Path, blocker: Path | None = None) -> OutputError:
    """The error of an output directory `path` that cannot be one: it (or `blocker`, a path above it) is
    something else, named."""
    blocker = path if blocker is None else blocker
    what = "a file" if blocker.is_file() else kind(os.stat(blocker).st_mode) if blocker.exists() else \
        "a dangling link"
    return OutputError(f"cannot be an output directory: {'it' if blocker == path else blocker} is {what}, not a "
                       f"directory: pass a directory (or a path where one can be made)", file=path)


def kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str | os.PathLike, error, cap: int, *, field: str | None = None) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `cap` of them. Anything
    else (missing, unreadable, a FIFO, a device, a directory, a socket, over the cap) is `error`
    naming the path: one open, one fstat, one read for a plain file."""
    try:
        fd = os.open(path, _OPEN)
    except OSError as e:
        raise error(f"cannot be read: {e.strerror}", file=path, field=field) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"is {kind(st.st_mode)}, not a regular file: refused", file=path, field=field)
        if st.st_size > cap:
            raise error(f"is {st.st_size} bytes, over the {cap}-byte cap", file=path, field=field)
        data = os.read(fd, st.st_size + 1)
        if not 0 < len(data) <= st.st_size:  # empty, or grown since fstat: read on, up to the cap
            chunks, n = [data], len(data)
            while n <= cap and (chunk := os.read(fd, min(1 << 20, cap + 1 - n))):
                chunks.append(chunk)
                n += len(chunk)
            data = b"".join(chunks)
    except OSError as e:
        raise error(f"cannot be read: {e.strerror}", file=path, field=field) from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise error(f"is over the {cap}-byte cap", file=path, field=field)
    return data


def contained(root: str | os.PathLike, rel: str, *, error, file=None, field: str | None = None) -> Path | None:
    """The real path of `rel` under `root`, every symlink resolved; it must stay under the root and be
    a regular file (else `error`). None when nothing is there."""
    top = os.path.realpath(root)
    real = os.path.realpath(os.path.join(top, rel))
    if not (real == top or real.startswith(top.rstrip(os.sep) + os.sep)):
        raise error(f"names {rel!r}, which resolves outside the project root to {real!r} (a symlink escaping the "
                    f"root is not allowed)", file=file, field=field)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise error(f"names {rel!r}, which cannot be read: {e.strerror}", file=file, field=field) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"names {rel!r}, which is {kind(st.st_mode)}, not a regular file", file=file, field=field)
    return Path(real)


@dataclass
class Found:
    """What `find` reached: real path -> path relative to the root (posix; of a file reached by two
    names, the lesser), and one error per entry it skipped (a symlink leaving the root, a FIFO or
    device, a dangling link or loop, a directory that cannot be listed)."""
    files: dict[str, str] = field(default_factory=dict)
    problems: list = field(default_factory=list)


def find(root: str | os.PathLike, pattern: str, *, suffix: str, error, file=None, field: str | None = None,
         max_entries: int | None = None, max_depth: int | None = None, root_name: str = "the project root") -> Found:
    """Every regular `*suffix` file `pattern` reaches under `root`: a path relative to the root, or a
    glob (`*`, `?`, `[...]`, and `**` for any depth, as `glob.glob(recursive=True)` reads them), each
    directory it names walked whole. A pattern that leaves the root, a plain path that does not exist,
    or a walk past `max_entries` entries or `max_depth` levels (default MAX_ENTRIES, MAX_DEPTH) raises
    `error` naming `file` and `field`."""
    return _Finder(root, suffix, error, file, field, max_entries or MAX_ENTRIES, max_depth or MAX_DEPTH,
                   root_name).run(pattern)


class _Finder:
    def __init__(self, root, suffix, error, file, field, max_entries, max_depth, root_name):
        self.root = os.path.realpath(root)
        self.top = self.root.rstrip(os.sep) + os.sep
        self.suffix, self.error, self.file, self.field = suffix, error, file, field
        self.max_entries, self.max_depth = max_entries, max_depth
        self.entries = 0
        self.root_name = root_name
        self.found = Found()
        self.walked: set[tuple[int, int]] = set()          # directories walked whole
        self.magic = False                                 # the pattern is a glob (else one path)
        self.listed: set[tuple[int, int, int]] = set()     # (dev, ino, glob segment) already matched

    def fail(self, rule: str):
        raise self.error(rule, file=self.file, field=self.field)

    def skip(self, rel: str, rule: str) -> None:
        self.found.problems.append(self.error(f"reaches {rel!r}, which {rule}", file=self.file, field=self.field))

    def rel(self, lex: str) -> str:
        if not lex.startswith(self.top):
            return "."
        return lex[len(self.top):] if os.sep == "/" else lex[len(self.top):].replace(os.sep, "/")

    def run(self, pattern: str) -> Found:
        if pattern.startswith(("/", "\\")) or os.path.isabs(pattern):
            self.fail(f"names {pattern!r}, an absolute path: sources are relative to the project root")
        segs = [s for s in pattern.replace("\\", "/").split("/") if s not in ("", ".")]
        if ".." in segs:
            self.fail(f"names {pattern!r}: `..` is not allowed (sources stay under the project root)")
        while segs and segs[-1] == "**":  # `dir/**` reaches what walking `dir` reaches
            segs.pop()
        segs = [s for i, s in enumerate(segs) if not (s == "**" and i and segs[i - 1] == "**")]
        magic = self.magic = any(_MAGIC & set(s) for s in segs)
        matches = self.expand(segs)
        if not matches and not magic:
            if self.found.problems:   # it is there, but skipped (a link leaving the root, a FIFO): say why
                raise self.found.problems[0]
            self.fail(f"names {pattern!r}, which does not exist under {self.root}")
        for lex, real, depth in sorted(matches):
            self.take(lex, real, depth)
        return self.found

    # -- classification -----------------------------------------------------------------------------
    def resolve(self, lex: str, parent_real: str, name: str, is_link: bool):
        """(real path, stat following links) of one entry, or None when it is skipped (noted)."""
        real = os.path.join(parent_real, name)
        if is_link:
            real = os.path.realpath(real)
            if not (real == self.root or real.startswith(self.top)):
                if name.endswith(self.suffix) or os.path.isdir(real):
                    self.skip(self.rel(lex), f"resolves outside {self.root_name} to {real!r} (a symlink escaping "
                                             f"the root is not allowed)")
                return None
        try:
            return real, os.stat(real)
        except OSError as e:
            if name.endswith(self.suffix):
                self.skip(self.rel(lex), f"cannot be followed: {e.strerror} (a dangling symlink or a symlink loop)")
            return None

    def take(self, lex: str, real: str, depth: int) -> None:
        """One match of the pattern: a directory is walked whole, a `*suffix` file kept."""
        try:
            st = os.stat(real)
        except OSError as e:
            if lex.endswith(self.suffix):
                self.skip(self.rel(lex), f"cannot be read: {e.strerror}")
            return
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) not in self.walked:
                self.walked.add((st.st_dev, st.st_ino))
                self.walk(lex, real, depth)
        elif not self.magic and not lex.endswith(self.suffix):   # named by itself: it can never be one
            self.fail(f"names {self.rel(lex)!r}, which is not a *{self.suffix} file: name the directory that holds "
                      f"them, or the files themselves")
        else:
            self.keep(lex, real, st.st_mode)

    def keep(self, lex: str, real: str, mode: int) -> None:
        if not lex.endswith(self.suffix):
            return
        if stat.S_ISREG(mode):
            rel, files = self.rel(lex), self.found.files
            if real not in files or rel < files[real]:  # one file, two names: the same name every build
                files[real] = rel
        else:
            self.skip(self.rel(lex), f"is {kind(mode)}, not a regular file: skipped")

    def entries_of(self, lex: str, real: str, depth: int):
        if depth > self.max_depth:
            self.fail(f"reaches {self.rel(lex)!r}, more than {self.max_depth} directory levels deep (a symlink loop "
                      f"or a runaway `**`?)")
        try:
            with os.scandir(real) as it:
                entries = list(it)
        except OSError as e:
            self.skip(self.rel(lex), f"cannot be listed: {e.strerror}")
            return []
        self.entries += len(entries)
        if self.entries > self.max_entries:
            self.fail(f"reaches more than {self.max_entries} directory entries under {self.rel(lex)!r} (narrow the "
                      f"source, or split it)")
        return entries

    # -- walking a directory whole ------------------------------------------------------------------
    def walk(self, lex: str, real: str, depth: int) -> None:
        """Every `*suffix` file under a directory; subdirectories in name order, so which of two paths
        to one directory is walked (and names its files) is the same every build."""
        stack = [(lex, real, depth)]
        suffix = self.suffix
        while stack:
            lex, real, depth = stack.pop()
            same = lex == real  # no symlink crossed yet: an entry's path is its lexical path
            subdirs = []
            for entry in self.entries_of(lex, real, depth):
                child = entry.path if same else os.path.join(lex, entry.name)
                if not entry.is_symlink():
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append((entry.name, child, entry.path, entry.stat(follow_symlinks=False)))
                    elif entry.name.endswith(suffix):
                        mode = stat.S_IFREG if entry.is_file(follow_symlinks=False) else \
                            entry.stat(follow_symlinks=False).st_mode
                        self.keep(child, entry.path, mode)
                    continue
                got = self.resolve(child, real, entry.name, True)
                if got is None:
                    continue
                if stat.S_ISDIR(got[1].st_mode):
                    subdirs.append((entry.name, child, got[0], got[1]))
                else:
                    self.keep(child, got[0], got[1].st_mode)
            for _, child, target, st in sorted(subdirs, key=lambda d: d[0], reverse=True):
                if (st.st_dev, st.st_ino) not in self.walked:
                    self.walked.add((st.st_dev, st.st_ino))
                    stack.append((child, target, depth + 1))

    # -- expanding a glob ---------------------------------------------------------------------------------
    def expand(self, segs: list[str]) -> list[tuple[str, str, int]]:
        """(lexical path, real path, depth) of everything the segments match, each state visited once."""
        out, stack = [], [(self.root, self.root, 0, 0)]
        while stack:
            lex, real, i, depth = stack.pop()
            if i == len(segs):
                out.append((lex, real, depth))
                continue
            seg = segs[i]
            if not _MAGIC & set(seg):
                child = os.path.join(lex, seg)
                if os.path.lexists(os.path.join(real, seg)):
                    got = self.resolve(child, real, seg, os.path.islink(os.path.join(real, seg)))
                    if got is not None:
                        stack.append((child, got[0], i + 1, depth + 1))
                continue
            try:
                st = os.stat(real)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino, i) in self.listed:
                continue
            self.listed.add((st.st_dev, st.st_ino, i))
            if seg == "**":
                stack.append((lex, real, i + 1, depth))  # zero directories
            for entry in self.entries_of(lex, real, depth):
                if entry.name.startswith(".") and not seg.startswith("."):
                    continue  # as glob: wildcards do not match hidden names
                if seg != "**" and not fnmatch.fnmatchcase(entry.name, seg):
                    continue
                child = os.path.join(lex, entry.name)
                if seg == "**" and not entry.is_dir():
                    continue
                got = self.resolve(child, real, entry.name, entry.is_symlink())
                if got is not None:
                    stack.append((child, got[0], i if seg == "**" else i + 1, depth + 1))
        return out
