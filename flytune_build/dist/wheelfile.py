"""A wheel opened the way installers and the runtime will read it, for `flytune verify`, `inspect`, `diff`.

- Member names: no absolute path, no `..`, no backslash, no name twice, nor, among the bundle's and the
  .dist-info's members, two that differ only in case or Unicode form (an installer would write outside the
  target, or keep one of two members at random; on macOS, and for case on Windows, where those are one
  file, the one written last). Other members' case is the package's own business.
- RECORD: read as installers read it (UTF-8 CSV); every member hashed as a stream, in any algorithm
  the wheel spec allows (sha256 or stronger from hashlib.algorithms_guaranteed: not md5, sha1, the
  224-bit digests nor the variable-length shake), so a small wheel holding a huge member costs time,
  never memory. Only the bundle's own files are read whole, each up to a cap.
- Entry points: parsed by importlib.metadata itself, as the runtime will parse them.
- Every zipfile, zlib, csv and Unicode failure becomes a BundleError naming the member: never a traceback.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import posixpath
import struct
import zipfile
import zlib
from pathlib import PurePosixPath

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..core.errors import BundleError
from ..core.fsutil import one_file
from ..core.serving import DIRNAME

try:
    from lzma import LZMAError
except ImportError:  # a Python built without lzma cannot open such members at all (NotImplementedError)
    class LZMAError(Exception):
        pass

# what reading a hostile archive raises: every decompressor's error (a corrupt LZMA member is none of
# the others), ValueError for UnicodeDecodeError, RuntimeError for encryption
DECOMPRESS_ERRORS = (zlib.error, LZMAError, EOFError, OSError)
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, struct.error, ValueError, NotImplementedError, RuntimeError,
              *DECOMPRESS_ERRORS)
HASHES = frozenset(a for a in hashlib.algorithms_guaranteed
                   if a not in ("md5", "sha1") and not a.startswith("shake_") and hashlib.new(a).digest_size >= 32)
UNLISTED = ("RECORD", "RECORD.jws", "RECORD.p7s")  # the spec keeps these out of RECORD
MAX_RECORD_BYTES = 64 << 20
MAX_ENTRY_POINTS_BYTES = 1 << 20
CHUNK = 1 << 20


class Wheel:
    """An open wheel: its checked members, the problems found opening it, its entry points."""

    def __init__(self, path, zf: zipfile.ZipFile):
        self.path, self.zf = str(path), zf
        self.errors: list[BundleError] = []
        self.members: dict[str, zipfile.ZipInfo] = {}
        seen: dict[str, str] = {}   # fsutil.one_file(name) -> the name first seen so
        for info in zf.infolist():
            problem = name_problem(info.filename, info.orig_filename)
            name = info.filename.rstrip("/")
            checked = name.split("/")[0].endswith(".dist-info") or f"/{DIRNAME}/" in f"/{name.lower()}/"
            key = one_file(name) if checked else name
            other = seen.get(key)
            if other is None:
                seen[key] = name
            if problem:
                self.fail(info.filename, problem)
            elif other == name:
                self.fail(info.filename, "appears twice in the archive (an installer keeps one of them)")
            elif other is not None:
                self.fail(info.filename, f"differs only in case or Unicode form from {other}: one file on macOS (and, "
                                         f"by case, on Windows), where installing keeps only the member written last")
            elif not info.is_dir():
                self.members[info.filename] = info
        records = [n for n in self.members if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
        self.dist_info = records[0].split("/")[0] if len(records) == 1 else None
        if self.dist_info is None:
            self.errors.append(BundleError("must hold exactly one *.dist-info/RECORD", file=path, field="RECORD"))

    def fail(self, member: str, rule: str, field: str | None = None) -> None:
        self.errors.append(BundleError(rule, file=f"{self.path}!{member}", field=field))

    def read(self, name: str, cap: int) -> bytes | None:
        """A member's bytes, at most `cap` of them; None when absent. A BundleError when unreadable."""
        info = self.members.get(name)
        if info is None:
            return None
        if info.file_size > cap:
            raise BundleError(f"is {info.file_size} bytes, over the {cap}-byte cap", file=f"{self.path}!{name}")
        refuse(info, self.path)
        try:
            with self.zf.open(info) as fh:
                data = fh.read(cap + 1)
        except ZIP_ERRORS as e:
            raise BundleError(f"cannot be read from the archive: {e}", file=f"{self.path}!{name}") from None
        if len(data) > cap:
            raise BundleError(f"is over the {cap}-byte cap", file=f"{self.path}!{name}")
        return data

    def text(self, name: str, cap: int) -> str | None:
        data = self.read(name, cap)
        try:
            return None if data is None else data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BundleError(f"is not valid UTF-8 (byte {e.start}): installers and importlib.metadata cannot read it",
                              file=f"{self.path}!{name}") from None

    def check_identity(self) -> None:
        """What installers check before they install anything (pip, installer): a file name of the wheel
        name scheme, a `.dist-info` of that project and version, and a `WHEEL` of format 1."""
        file = os.path.basename(self.path)
        try:
            name, version, _, _ = parse_wheel_filename(file)
        except (InvalidWheelFilename, InvalidVersion) as e:
            self.errors.append(BundleError(f"is no wheel file name ({e}): installers refuse it; a wheel is named "
                                           f"NAME-VERSION-PYTHON-ABI-PLATFORM.whl", file=self.path))
            return
        if self.dist_info is None:
            return
        stem = self.dist_info.removesuffix(".dist-info")
        got, _, raw = stem.rpartition("-")
        try:
            same = canonicalize_name(got) == name and Version(raw) == version
        except InvalidVersion:
            same = False
        if not same:
            self.fail(self.dist_info, f"is not the .dist-info of {name} {version}, which the file name says: "
                                      f"installers refuse the wheel")
        wheel = self.text(f"{self.dist_info}/WHEEL", MAX_RECORD_BYTES)
        major = next((line.split(":", 1)[1].strip().split(".")[0] for line in (wheel or "").splitlines()
                      if line.lower().startswith("wheel-version:")), None)
        if wheel is None:
            self.fail(f"{self.dist_info}/WHEEL", "is missing: installers refuse a wheel without it")
        elif major != "1":
            self.fail(f"{self.dist_info}/WHEEL", f"must say 1.x, not {major!r}: installers refuse any other format",
                      "Wheel-Version")

    # -- RECORD ----------------------------------------------------------------------------------------
    def check_record(self) -> None:
        """Every member against RECORD, both ways, hashing each as a stream."""
        if self.dist_info is None:
            return
        name = f"{self.dist_info}/RECORD"
        try:
            listed = self.record(self.text(name, MAX_RECORD_BYTES) or "", name)
        except BundleError as e:
            self.errors.append(e)
            return
        unlisted = {f"{self.dist_info}/{n}" for n in UNLISTED}
        for member, info in sorted(self.members.items()):
            if member in unlisted:
                continue
            if member not in listed:
                self.fail(member, "is in the wheel but missing from RECORD", "RECORD")
                continue
            problem = self.check_member(info, *listed[member])
            if problem:
                self.fail(member, problem, "RECORD")
        for member in sorted(set(listed) - set(self.members) - unlisted):
            self.fail(member, "is listed in RECORD but absent from the wheel", "RECORD")

    def record(self, text: str, name: str) -> dict[str, tuple[str, str]]:
        listed: dict[str, tuple[str, str]] = {}
        reader = csv.reader(io.StringIO(text, newline=""))
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return listed
            except csv.Error as e:  # a field over csv.field_size_limit(), a NUL, a stray quote
                raise BundleError(f"line {reader.line_num} cannot be read as CSV ({e}): installers reject it",
                                  file=f"{self.path}!{name}") from None
            if not row:
                continue
            if len(row) != 3:
                self.fail(name, f"line {reader.line_num} has {len(row)} fields, not 3 (path, hash, size)")
            elif row[0] in listed:
                self.fail(row[0], f"is listed twice in RECORD (line {reader.line_num})", "RECORD")
            else:
                listed[row[0]] = (row[1], row[2])

    def check_member(self, info: zipfile.ZipInfo, digest: str, size: str) -> str | None:
        """What is wrong with one member against its RECORD line, streamed; None when it matches."""
        algorithm, _, expected = digest.partition("=")
        if algorithm not in HASHES:
            return (f"has RECORD hash {algorithm or '(none)'!r}: the wheel spec requires sha256 or stronger "
                    f"({', '.join(sorted(HASHES))})")
        if not (size.isascii() and size.isdigit()) or int(size) != info.file_size:
            return f"does not match its RECORD line (size {size!r}, the member holds {info.file_size} bytes)"
        try:
            refuse(info, self.path)
            h, n = hashlib.new(algorithm), 0
            with self.zf.open(info) as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    n += len(chunk)
        except BundleError as e:
            return e.rule
        except ZIP_ERRORS as e:  # a CRC mismatch (bytes changed in place), corrupt deflate, truncation
            return f"cannot be read from the archive: {e}"
        if encode(h.digest()) != expected.rstrip("=") or n != int(size):
            return f"does not match its RECORD line ({algorithm} or size differs: the member was altered)"
        return None

    # -- entry points -------------------------------------------------------------------------------------
    def entry_points(self, group: str) -> list:
        """The entry points in `group`, parsed by importlib.metadata as the runtime parses them."""
        if self.dist_info is None:
            return []
        name = f"{self.dist_info}/entry_points.txt"
        try:
            text = self.text(name, MAX_ENTRY_POINTS_BYTES)
            return [ep for ep in _Metadata(text).entry_points if ep.group == group]
        except BundleError as e:
            self.errors.append(e)
        except (ValueError, TypeError) as e:  # a line without `=`: importlib.metadata raises on it as well
            self.fail(name, f"cannot be parsed by importlib.metadata ({e}): the runtime will not read it")
        return []


class _Metadata(importlib.metadata.Distribution):
    """Only entry_points.txt, so importlib.metadata parses it exactly as for an installed distribution."""

    def __init__(self, entry_points: str | None):
        self._entry_points = entry_points

    def read_text(self, filename):
        return self._entry_points if filename == "entry_points.txt" else None

    def locate_file(self, path):
        return PurePosixPath(path)


def open_wheel(path) -> Wheel:
    """The wheel at `path`, its member names checked; a BundleError when it is no readable zip."""
    try:
        zf = zipfile.ZipFile(path)
    except ZIP_ERRORS as e:  # invalid UTF-8 names flagged as UTF-8 raise here, too
        raise BundleError(f"is not a readable zip archive: {type(e).__name__}: {e}", file=path) from None
    try:
        return Wheel(path, zf)
    except BaseException:
        zf.close()
        raise


def name_problem(name: str, orig: str) -> str | None:
    """Why an installer must not write this member name, or None."""
    if orig != name and "\x00" in orig:
        return "has a NUL in its name (zipfile truncates it there; other tools do not)"
    if name.startswith(("/", "\\")) or (name[1:2] == ":" and name[:1].isalpha()):
        return "is an absolute path: an installer would write outside the target directory"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "holds `..`: an installer would write outside the target directory"
    if "\\" in name:
        return ("holds a backslash: an installer on Windows writes it as a folder separator, one elsewhere as part "
                "of a file name (`pkg\\x.py` is no module of `pkg/` there)")
    if posixpath.normpath(name.rstrip("/") or "/") != name.rstrip("/"):
        return "is not a normalised path (`.` or empty components): two names could mean one file"
    return None


def refuse(info: zipfile.ZipInfo, path: str) -> None:
    """Encrypted members are refused before they are opened (zipfile would ask for a password)."""
    if info.flag_bits & 0x1:
        raise BundleError("is encrypted: installers cannot read it", file=f"{path}!{info.filename}")


def encode(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def digest(algorithm: str, data: bytes) -> str | None:
    """RECORD's form of `data`'s hash (urlsafe base64, unpadded); None for an algorithm the spec refuses."""
    return encode(hashlib.new(algorithm, data).digest()) if algorithm in HASHES else None


def modules(paths) -> set[str]:
    """The import packages and modules that files at `paths` (in a wheel, or a distribution's RECORD) install."""
    out = set()
    for p in paths:
        parts = str(p).replace("\\", "/").split("/")
        if parts[0].endswith((".dist-info", ".data", ".egg-info")) or ".." in parts:
            continue
        stem = parts[-1].split(".")[0]
        names = parts[:-1] + ([] if stem == "__init__" else [stem])
        if parts[-1].endswith((".py", ".so", ".pyd")) and names and all(n.isidentifier() for n in names):
            out.update(".".join(names[:i]) for i in range(1, len(names) + 1))
    return out
