"""Rewrite a wheel reproducibly, adding the bundle and its entry point.

setuptools alone is not reproducible (file mtimes, umask-dependent modes, walk order; wheel#248,
setuptools#1468). Every member gets one timestamp (SOURCE_DATE_EPOCH when set, else 1980-01-01),
mode 0644 or 0755, a sorted order with the dist-info last and RECORD regenerated.
"""
from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import io
import stat
import time
import zipfile
from pathlib import Path

from ..core import settings
from ..core.fsutil import atomic_write

ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest a zip timestamp can hold


def timestamp() -> tuple:
    epoch = settings.read().source_date_epoch  # read per build: a backend process may build twice
    t = ZIP_EPOCH if epoch is None else max(epoch, ZIP_EPOCH)
    return time.gmtime(t)[:6]


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_entry_point(text: str, group: str, name: str, value: str) -> str:
    # no section is configparser's DEFAULT: a group named `DEFAULT` would be copied into every group
    # ("\n" can be no section's name: headers are read one line at a time)
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), default_section="\n")
    parser.optionxform = str
    parser.read_string(text)
    if not parser.has_section(group):
        parser.add_section(group)
    parser.set(group, name, value)
    out = []
    for section in sorted(parser.sections()):
        out.append(f"[{section}]")
        out.extend(f"{k} = {v}" for k, v in sorted(parser.items(section)))
        out.append("")
    return "\n".join(out)


def rewrite(wheel: Path, files: dict[str, bytes], entry_point: tuple[str, str, str] | None,
            drop_prefix: str | None = None) -> None:
    """Add `files`, register `entry_point` (group, name, value), normalise, and replace atomically."""
    with zipfile.ZipFile(wheel) as zf:
        members = {}
        for info in zf.infolist():
            if info.is_dir():
                continue
            executable = bool((info.external_attr >> 16) & stat.S_IXUSR)
            members[info.filename] = (zf.read(info), executable)
    dist_info = next(n.split("/")[0] for n in members if n.split("/")[0].endswith(".dist-info")
                     and n.endswith("/WHEEL"))
    record = f"{dist_info}/RECORD"
    members.pop(record, None)
    if drop_prefix:
        for name in [n for n in members if n.startswith(drop_prefix)]:
            del members[name]
    for name, data in files.items():
        members[name] = (data, False)
    if entry_point is not None:
        ep_file = f"{dist_info}/entry_points.txt"
        old = members.get(ep_file, (b"", False))[0].decode("utf-8")
        members[ep_file] = (add_entry_point(old, *entry_point).encode("utf-8"), False)
    write(wheel, members, dist_info)


def record_bytes(rows) -> bytes:
    """RECORD as installers read it: CSV, so a path holding a comma or a quote is quoted."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue().encode("utf-8")


def write(wheel: Path, members: dict[str, tuple[bytes, bool]], dist_info: str) -> None:
    record = f"{dist_info}/RECORD"
    order = sorted(n for n in members if not n.startswith(dist_info + "/")) + \
        sorted(n for n in members if n.startswith(dist_info + "/"))
    rows = [(n, record_hash(members[n][0]), len(members[n][0])) for n in order] + [(record, "", "")]
    date = timestamp()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        for name in order + [record]:
            data, executable = members[name] if name != record else (record_bytes(rows), False)
            info = zipfile.ZipInfo(name, date_time=date)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
            info.create_system = 3
            out.writestr(info, data, compresslevel=6)
    atomic_write(wheel, buf.getvalue())
