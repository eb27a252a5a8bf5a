"""Archives other tools must accept: RECORD read as CSV by installers, sdists unpacked safely on every
supported Python (the `data` extraction filter exists only from 3.10.12 / 3.11.4 on)."""
import csv
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from flytune_build.audit import source as audit
from flytune_build.dist import archive
from flytune_build.dist import wheel

ODD = ["fixpkg/a,b.txt", 'fixpkg/say "hi".txt', "fixpkg/plain.txt"]


def odd_wheel(out: Path) -> Path:
    dist_info = "fixpkg-1.0.dist-info"
    members = {
        "fixpkg/__init__.py": (b"", False),
        **{name: (name.encode(), False) for name in ODD},
        f"{dist_info}/METADATA": (b"Metadata-Version: 2.1\nName: fixpkg\nVersion: 1.0\n", False),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
                               False),
    }
    path = out / "fixpkg-1.0-py3-none-any.whl"
    out.mkdir(parents=True, exist_ok=True)
    wheel.write(path, members, dist_info)
    return path


def test_record_quotes_paths_with_commas_and_quotes_so_installers_accept_the_wheel(tmp_path):
    whl = odd_wheel(tmp_path / "dist")
    with zipfile.ZipFile(whl) as zf:
        record = zf.read("fixpkg-1.0.dist-info/RECORD").decode()
    rows = [r for r in csv.reader(io.StringIO(record)) if r]
    assert {r[0] for r in rows} >= set(ODD) and all(len(r) == 3 for r in rows)
    assert '"fixpkg/a,b.txt",' in record and "fixpkg/plain.txt,sha256=" in record  # quoted only when needed

    from wheel.wheelfile import (
        WheelFile,  # reads RECORD with csv and checks each member's hash on read
    )

    with WheelFile(whl) as wf:
        for name in ODD:
            assert wf.read(name) == name.encode()
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(target), str(whl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (target / "fixpkg" / "a,b.txt").read_text() == "fixpkg/a,b.txt"
    assert not [e for e in audit.verify(str(whl)).errors if "RECORD" in str(e)]  # every line read back


# -- sdist extraction ------------------------------------------------------------------------------------
def make_tar(path: Path, entries) -> Path:
    """entries: (TarInfo fields as a dict, bytes or None)."""
    with tarfile.open(path, "w:gz") as tf:
        for fields, data in entries:
            info = tarfile.TarInfo(fields.pop("name"))
            for k, v in fields.items():
                setattr(info, k, v)
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def good_entries():
    return [({"name": "pkg-1.0", "type": tarfile.DIRTYPE, "mode": 0o755}, None),
            ({"name": "pkg-1.0/pyproject.toml", "mode": 0o4777}, b"[project]\n"),
            ({"name": "pkg-1.0/run.sh", "mode": 0o755}, b"#!/bin/sh\n"),
            ({"name": "pkg-1.0/sub/link.toml", "type": tarfile.SYMTYPE, "linkname": "../pyproject.toml"}, None)]


def old_tarfile(monkeypatch):
    """tarfile as on 3.10.0-3.10.11 / 3.11.0-3.11.3: no data_filter, and extractall takes no `filter`."""
    monkeypatch.delattr(tarfile, "data_filter")
    original = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return original(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


@pytest.fixture(params=["data_filter", "fallback"])
def extractor(request, monkeypatch):
    """Both paths: tarfile's own `data` filter where this Python has it, and the hand-written one."""
    if request.param == "fallback":
        old_tarfile(monkeypatch)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile.data_filter")
    return request.param


def test_sdist_extracts_files_dirs_and_inner_links_with_sane_modes(tmp_path, extractor):
    sdist = make_tar(tmp_path / "pkg-1.0.tar.gz", good_entries())
    out = tmp_path / "out"
    archive.extract(sdist, out)
    top = out / "pkg-1.0"
    assert (top / "pyproject.toml").read_bytes() == b"[project]\n"
    assert (top / "pyproject.toml").stat().st_mode & 0o7777 == 0o755  # setuid and group/other write dropped
    assert (top / "run.sh").stat().st_mode & 0o100
    assert (top / "sub" / "link.toml").read_bytes() == b"[project]\n"


def test_an_sdist_holding_no_project_or_two_says_which(tmp_path):
    from flytune_build.audit.source import open_source

    none = make_tar(tmp_path / "none-1.0.tar.gz", [({"name": "pkg-1.0/README", "mode": 0o644}, b"x")])
    assert [e.rule for e in open_source(str(none)).errors] == ["has no top-level directory with pyproject.toml"]
    two = make_tar(tmp_path / "two-1.0.tar.gz", [({"name": f"{d}/pyproject.toml", "mode": 0o644}, b"[project]\n")
                                                 for d in ("a-1.0", "b-1.0")])
    assert [e.rule for e in open_source(str(two)).errors] == \
        ["has 2 top-level directories with pyproject.toml (a-1.0, b-1.0): an sdist holds one project"]


EVIL = [
    ("absolute", {"name": "/tmp/flytune-evil.txt"}, b"x"),
    ("dotdot", {"name": "pkg-1.0/../../evil.txt"}, b"x"),
    ("link-out", {"name": "pkg-1.0/evil", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, None),
    ("link-up", {"name": "pkg-1.0/evil", "type": tarfile.SYMTYPE, "linkname": "../../outside"}, None),
    ("hardlink-out", {"name": "pkg-1.0/evil", "type": tarfile.LNKTYPE, "linkname": "/etc/passwd"}, None),
    ("device", {"name": "pkg-1.0/dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, None),
    ("fifo", {"name": "pkg-1.0/fifo", "type": tarfile.FIFOTYPE}, None),
]


@pytest.mark.parametrize("case,fields,data", EVIL, ids=[c[0] for c in EVIL])
def test_sdist_member_escaping_or_special_is_refused(tmp_path, extractor, case, fields, data):
    sdist = make_tar(tmp_path / "evil.tar.gz", [({"name": "pkg-1.0/ok.txt"}, b"ok"), (dict(fields), data)])
    out = tmp_path / "out"
    try:
        archive.extract(sdist, out)
        refused = False
    except tarfile.TarError:
        refused = True
    # tarfile's own filter strips a leading "/" and extracts inside; the fallback refuses the member
    assert refused or (case == "absolute" and extractor == "data_filter"
                       and (out / "tmp" / "flytune-evil.txt").is_file())
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/flytune-evil.txt").exists()
    assert not any(p.is_symlink() or p.is_char_device() or p.is_fifo() for p in out.rglob("*"))


def test_old_tarfile_without_the_filter_still_extracts_a_project_tarball(tmp_path, monkeypatch):
    from buildkit import make_project

    proj = make_project(tmp_path / "p")
    sdist = tmp_path / "fixpkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(proj, arcname="fixpkg-1.0")
    old_tarfile(monkeypatch)
    with pytest.raises(TypeError), tarfile.open(sdist) as tf:  # extractall(filter="data") on such a Python
        tf.extractall(tmp_path / "x", filter="data")
    archive.extract(sdist, tmp_path / "out")
    assert (tmp_path / "out" / "fixpkg-1.0" / "pyproject.toml").is_file()
    assert len(list((tmp_path / "out" / "fixpkg-1.0" / "artifacts").glob("*.json"))) == 2


def test_unreadable_archive_is_a_tar_error(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(tarfile.TarError):
        archive.extract(bad, tmp_path / "out")
    assert os.path.exists(bad)


@pytest.mark.parametrize("head", [b"", b"\0" * 4096, b"PK\x03\x04 not a tar", b"\x1f\x8b\x08 a gzip header, then nothing"])
def test_an_sdist_that_is_no_tar_archive_is_said_so_at_once(tmp_path, head):
    """A file of zeros (preallocated, half downloaded) was read to its end by xz as padding before "r:*"
    gave up: a minute per 200 MB, then "no top-level directory". Its first bytes decide, once."""
    path = tmp_path / "z.tar.gz"
    with open(path, "wb") as f:
        f.write(head)
        if head == b"\0" * 4096:
            f.truncate(64 << 20)   # sparse: 64 MiB of zeros
    src = audit.verify(str(path))
    (err,) = src.errors
    assert "is not a readable sdist" in str(err) and str(path) in str(err)
    assert ("is not a tar archive" in str(err)) == (head in (b"", b"\0" * 4096)), err   # the rest: as tarfile says
    with pytest.raises(tarfile.TarError):
        archive.extract(path, tmp_path / "out")


def test_an_old_v7_tar_without_the_ustar_magic_still_opens(tmp_path):
    path = tmp_path / "old.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        data = b"[project]\n"
        info = tarfile.TarInfo("p/pyproject.toml")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    raw = bytearray(path.read_bytes())
    raw[257:265] = b"\0" * 8   # v7: no magic, no version
    raw[148:156] = b"        "
    raw[148:155] = f"{sum(raw[:512]):06o}\0".encode()   # the header's checksum again
    path.write_bytes(bytes(raw))
    with archive.open_tar(path) as tf:
        assert tf.getnames() == ["p/pyproject.toml"]
