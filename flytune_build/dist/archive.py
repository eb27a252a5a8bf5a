"""Unpacking an sdist safely on every Python flytune supports.

`tarfile`'s `data` filter (PEP 706) exists from 3.10.12 / 3.11.4 / 3.12 on; `requires-python` is
">=3.10". Where it exists it is used. Elsewhere the same rules are applied by hand, and stricter:
no absolute path and no `..` anywhere, no device, FIFO or link leaving the tree; regular files and
directories only (a link to a file inside the archive becomes a copy of it); modes are reduced to
rwx for the owner and at most r-x for the others, exactly as the filter does. Any refusal is a
`tarfile.TarError` naming the member; nothing outside the destination is ever written.
"""
from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path


class UnsafeMember(tarfile.TarError):
    """A member the safe extraction refuses (what `tarfile.FilterError` is on newer Pythons)."""


MAGIC = ((b"\x1f\x8b", "gz"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))   # what each compression begins with


def open_tar(archive: str | os.PathLike) -> tarfile.TarFile:
    """`archive` opened by what its first bytes say it is (gzip, bzip2, xz, or a plain tar: `ustar` at
    byte 257); an empty file or one of zeros refused at once (`tarfile.ReadError`); anything else as
    tarfile reads it. `tarfile`'s "r:*" tries each decompressor in turn, and xz reads a file of zeros (a
    preallocated or half-downloaded sdist) to its end as padding: a minute per 200 MB, then "no top-level
    directory"."""
    with open(archive, "rb") as f:
        head = f.read(512)
    mode = next((m for magic, m in MAGIC if head.startswith(magic)), None)
    if mode is None and not head.strip(b"\0"):
        raise tarfile.ReadError("is not a tar archive: it is empty" if not head else "is not a tar archive: it "
                                "begins with zero bytes (a file preallocated, or not downloaded whole?)")
    if mode is None and head[257:262] != b"ustar":   # an old v7 tar, lzma-alone: tarfile tries each
        return tarfile.open(archive, "r:*")
    return tarfile.open(archive, f"r:{mode}" if mode else "r:")


def extract(archive: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Unpack the tar archive `archive` (any compression) into `dest`, refusing unsafe members."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    with open_tar(archive) as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, filter="data")
        else:
            extract_members(tf, Path(dest))


def extract_members(tf: tarfile.TarFile, dest: Path) -> None:
    """The `data` filter written out: check every member first, then write dirs, files, link copies."""
    dest = dest.resolve()
    dirs, files, links = [], {}, []
    for m in tf.getmembers():
        name = safe_name(m.name)
        if m.isdir():
            dirs.append(name)
        elif m.isreg():
            files[name] = m
        elif m.issym() or m.islnk():
            links.append((name, link_target(m, name)))
        else:
            raise UnsafeMember(f"{m.name!r} is a device, FIFO or other special file")
    for name in sorted(dirs):
        inside(dest, name).mkdir(parents=True, exist_ok=True)
    for name, m in files.items():
        write(inside(dest, name), tf.extractfile(m).read(), m.mode)
    for name, target in links:
        if target not in files:
            raise UnsafeMember(f"{name!r} links to {target!r}, which is not a regular file in the archive")
        write(inside(dest, name), tf.extractfile(files[target]).read(), files[target].mode)


def safe_name(name: str) -> str:
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (name[1:2] == ":" and name[:1].isalpha()):
        raise UnsafeMember(f"{name!r} is an absolute path")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise UnsafeMember(f"{name!r} leaves the destination (`..`) or names nothing")
    return "/".join(parts)


def link_target(m: tarfile.TarInfo, name: str) -> str:
    """The archive path a link points to; refused when absolute or outside the archive."""
    if m.linkname.startswith(("/", "\\")) or os.path.isabs(m.linkname):
        raise UnsafeMember(f"{m.name!r} links to the absolute path {m.linkname!r}")
    # a symlink is relative to its own directory, a hard link to the archive root
    base = posixpath.dirname(name) if m.issym() else ""
    target = posixpath.normpath(posixpath.join(base, m.linkname.replace("\\", "/")))
    if target == ".." or target.startswith("../"):
        raise UnsafeMember(f"{m.name!r} links outside the destination ({m.linkname!r})")
    return target


def inside(dest: Path, name: str) -> Path:
    path = dest / name
    if not str(path.resolve()).startswith(str(dest) + os.sep):  # no symlink is ever made, but be sure
        raise UnsafeMember(f"{name!r} resolves outside the destination")
    return path


def write(path: Path, data: bytes, mode: int) -> None:
    mode = (mode & 0o755) | 0o600
    if not mode & 0o100:
        mode &= ~0o111
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
