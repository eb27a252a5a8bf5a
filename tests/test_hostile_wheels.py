"""`flytune verify`, `inspect` and `diff` read a wheel as installers and the runtime will: each hostile
wheel is one case, run through the real CLI in a subprocess under a timeout, and each must give exit 1
(or 0 where the wheel is sound), no traceback, the member and field named, the input untouched."""
import base64
import hashlib
import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from buildkit import make_project, pip_wheel
from conftest import python_env

SHARD = "fixpkg/_flytune/fixpkg.add.json"
MANIFEST = "fixpkg/_flytune/manifest.json"
DIST = "fixpkg-1.0.dist-info"
RECORD = f"{DIST}/RECORD"
EPS = f"{DIST}/entry_points.txt"
TIMEOUT = 120


def flytune(*args, timeout=TIMEOUT, **env):
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", *map(str, args)], capture_output=True, text=True,
                       env=python_env(**env), timeout=timeout, check=False)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("good")
    r = pip_wheel(make_project(tmp / "p"), tmp / "dist")
    assert r.returncode == 0, r.stderr
    (whl,) = (tmp / "dist").glob("*.whl")
    return whl


def members(whl) -> dict:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != RECORD}


def digest(data: bytes, algorithm="sha256") -> str:
    return f"{algorithm}=" + base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()


def record_text(items, algorithm="sha256") -> bytes:
    rows = [f"{n},{digest(d, algorithm)},{len(d)}" for n, d in items if n != RECORD]
    return ("\n".join(rows + [f"{RECORD},,"]) + "\n").encode()


def write(dst: Path, items, record=None, algorithm="sha256", compression=zipfile.ZIP_DEFLATED) -> Path:
    """A wheel of `items` ((name or ZipInfo, bytes) in order); RECORD computed unless given."""
    items = list(items)
    plain = [(i.filename if isinstance(i, zipfile.ZipInfo) else i, d) for i, d in items]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are a case here
        with zipfile.ZipFile(dst, "w", compression) as zf:
            for name, data in items:
                zf.writestr(name, data)
            zf.writestr(RECORD, record if record is not None else record_text(plain, algorithm))
    return dst


def patch(data: bytes, name: bytes, new_name: bytes | None = None, *, flags: int = 0,
          method: int | None = None) -> bytes:
    """Edit a member's local and central headers in place: its name bytes, flag bits, method."""
    out = bytearray(data)
    start = 0
    while (i := out.find(name, start)) >= 0:
        start = i + 1
        for sig, off_flags, off_method, head in ((b"PK\x03\x04", 6, 8, 30), (b"PK\x01\x02", 8, 10, 46)):
            if bytes(out[i - head:i - head + 4]) == sig:
                h = i - head
                out[h + off_flags:h + off_flags + 2] = (int.from_bytes(out[h + off_flags:h + off_flags + 2], "little")
                                                       | flags).to_bytes(2, "little")
                if method is not None:
                    out[h + off_method:h + off_method + 2] = method.to_bytes(2, "little")
                if new_name is not None:
                    out[i:i + len(name)] = new_name
    return bytes(out)


def rewritten(good, tmp_path, change=None, **kw) -> Path:
    m = members(good)
    if change:
        change(m)
    return write(tmp_path / good.name, m.items(), **kw)


def entry_points(text):
    return lambda m: m.__setitem__(EPS, text.encode())


def move_bundle(package):
    def change(m):
        for n in [n for n in m if n.startswith("fixpkg/_flytune/")]:
            data = m.pop(n)
            if n == MANIFEST:
                doc = json.loads(data)
                doc["package"] = package
                data = json.dumps(doc).encode()
            m[n.replace("fixpkg/", package.replace(".", "/") + "/", 1)] = data
        m[EPS] = f"[flytune.bundles]\nfixpkg = {package}._flytune\n".encode()
    return change


def raw_zip(tmp_path, good, edit) -> Path:
    """The good wheel written STORED with one extra member `fixpkg/zzX.py`, then its bytes edited."""
    m = members(good)
    m["fixpkg/zzX.py"] = b"print('hi')\n" * 50
    path = write(tmp_path / good.name, m.items(), compression=zipfile.ZIP_STORED)
    path.write_bytes(edit(path.read_bytes()))
    return path


def corrupt_deflate(data: bytes, at: int = 0) -> bytes:
    i = data.find(b"PK\x03\x04")  # local headers: the stream is right after the name and extra field
    while True:
        n, e = int.from_bytes(data[i + 26:i + 28], "little"), int.from_bytes(data[i + 28:i + 30], "little")
        if data[i + 30:i + 30 + n] == b"fixpkg/zzX.py":
            body = i + 30 + n + e + at
            return data[:body] + b"\xff\xff\xff\xff" + data[body + 4:]
        i = data.find(b"PK\x03\x04", i + 1)


def deflated_zz(tmp_path, good):
    m = members(good)
    m["fixpkg/zzX.py"] = b"print('hi')\n" * 50
    path = write(tmp_path / good.name, m.items())
    path.write_bytes(corrupt_deflate(path.read_bytes()))
    return path


def lzma_zz(tmp_path, good):
    """`fixpkg/zzX.py` stored ZIP_LZMA, its stream corrupted: lzma's own error, not zlib's."""
    m = members(good)
    m["fixpkg/zzX.py"] = b"print('hi')\n" * 50
    path = write(tmp_path / good.name, m.items(), compression=zipfile.ZIP_LZMA)
    path.write_bytes(corrupt_deflate(path.read_bytes(), at=12))  # past the header: mid-stream
    return path


def flip_stored(data: bytes) -> bytes:
    i = data.find(b"print('hi')")
    return data[:i] + b"P" + data[i + 1:]


def huge_record_field(g, t):
    """A RECORD field past csv.field_size_limit() (131,072 characters by default)."""
    items = members(g).items()
    return write(t / g.name, items, record=record_text(items) + b"fixpkg/x.py,sha256=" + b"A" * 200_000 + b",1\n")


BAD_MANIFEST_SIZE = 2 << 20


def padded_manifest(m):
    m[MANIFEST] = m[MANIFEST] + b" " * BAD_MANIFEST_SIZE


# id, build(good, tmp_path) -> wheel, fragments the text report must hold
CASES = [
    # what installers refuse before installing anything (the wheel read ok, then pip refused it)
    ("renamed", lambda g, t: raw(t / "other-9.9-py3-none-any.whl", g.read_bytes()),
     ["is not the .dist-info of other 9.9, which the file name says"]),
    ("no-wheel-name", lambda g, t: raw(t / "notawheel.whl", g.read_bytes()), ["is no wheel file name"]),
    ("no-WHEEL", lambda g, t: rewritten(g, t, lambda m: m.pop(f"{DIST}/WHEEL")), ["WHEEL: is missing"]),
    ("wheel-version-2", lambda g, t: rewritten(g, t, lambda m: m.__setitem__(
        f"{DIST}/WHEEL", m[f"{DIST}/WHEEL"].replace(b"Wheel-Version: 1.0", b"Wheel-Version: 2.0"))),
     ["Field `Wheel-Version` must say 1.x, not '2'"]),
    ("not-a-zip", lambda g, t: raw(t / g.name, b"PK\x03\x04 not a zip"), ["not a readable zip archive"]),
    ("truncated", lambda g, t: raw(t / g.name, g.read_bytes()[: g.stat().st_size // 2]),
     ["not a readable zip archive"]),
    ("empty-file", lambda g, t: raw(t / g.name, b""), ["not a readable zip archive"]),
    ("no-record", lambda g, t: write(t / g.name, members(g).items(), record=b"") and _drop(t / g.name, RECORD),
     ["must hold exactly one *.dist-info/RECORD"]),
    ("two-records", lambda g, t: rewritten(g, t, lambda m: m.__setitem__("other-1.0.dist-info/RECORD", b"")),
     ["must hold exactly one *.dist-info/RECORD"]),
    ("no-bundle", lambda g, t: rewritten(g, t, lambda m: [m.pop(n) for n in list(m) if "_flytune" in n]
                                         + [m.pop(EPS)]), ["holds no flytune bundle"]),
    ("dotdot-member", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg/../../evil.py", b"x")]),
     ["fixpkg/../../evil.py", "holds `..`"]),
    ("absolute-member", lambda g, t: write(t / g.name, [*members(g).items(), ("/etc/evil.py", b"x")]),
     ["!/etc/evil.py", "absolute path"]),
    ("drive-member", lambda g, t: write(t / g.name, [*members(g).items(), ("C:/evil.py", b"x")]),
     ["C:/evil.py", "absolute path"]),
    ("backslash-dotdot", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg\\..\\..\\evil.py", b"x")]),
     ["holds `..`"]),
    ("backslash-member", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg\\zz.py", b"x")]),
     ["fixpkg\\zz.py", "holds a backslash"]),
    ("duplicate-member", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg/__init__.py", b"evil()")]),
     ["fixpkg/__init__.py", "appears twice"]),
    ("case-twin-manifest", lambda g, t: write(t / g.name, [*members(g).items(),
                                                          ("fixpkg/_flytune/Manifest.json", members(g)[MANIFEST])]),
     ["fixpkg/_flytune/Manifest.json", "differs only in case or Unicode form from fixpkg/_flytune/manifest.json"]),
    ("unicode-form-twin", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg/_flytune/caf\u00e9.py", b"x"),
                                                         ("fixpkg/_flytune/cafe\u0301.py", b"y")]),
     ["fixpkg/_flytune/cafe\u0301.py", "differs only in case or Unicode form from fixpkg/_flytune/caf\u00e9.py"]),
    ("dot-component", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg/./x.py", b"x")]),
     ["fixpkg/./x.py", "not a normalised path"]),
    ("nul-in-name", lambda g, t: raw_zip(t, g, lambda d: patch(d, b"fixpkg/zzX.py", b"fixpkg/zz\x00.py")),
     ["has a NUL"]),
    ("invalid-utf8-name", lambda g, t: raw_zip(t, g, lambda d: patch(d, b"fixpkg/zzX.py", b"fixpkg/zz\xff.py",
                                                                     flags=0x800)),
     ["not a readable zip archive", "UnicodeDecodeError"]),
    ("encrypted-flag", lambda g, t: raw_zip(t, g, lambda d: patch(d, b"fixpkg/zzX.py", flags=0x1)),
     ["fixpkg/zzX.py", "is encrypted"]),
    ("unsupported-compression", lambda g, t: raw_zip(t, g, lambda d: patch(d, b"fixpkg/zzX.py", method=99)),
     ["fixpkg/zzX.py", "cannot be read from the archive"]),
    ("deflate64", lambda g, t: raw_zip(t, g, lambda d: patch(d, b"fixpkg/zzX.py", method=9)),
     ["fixpkg/zzX.py", "cannot be read from the archive"]),
    ("corrupt-deflate", lambda g, t: deflated_zz(t, g), ["fixpkg/zzX.py", "cannot be read from the archive"]),
    ("corrupt-lzma", lambda g, t: lzma_zz(t, g), ["fixpkg/zzX.py", "cannot be read from the archive"]),
    ("bad-crc", lambda g, t: raw_zip(t, g, flip_stored), ["fixpkg/zzX.py", "cannot be read from the archive"]),
    ("record-not-utf8", lambda g, t: write(t / g.name, members(g).items(), record=b"fixpkg/\xff.py,,\n"),
     [f"!{RECORD}", "not valid UTF-8"]),
    ("record-huge-field", huge_record_field, [f"!{RECORD}", "cannot be read as CSV"]),
    ("record-nul", lambda g, t: write(t / g.name, members(g).items(),
                                      record=record_text(members(g).items()).replace(b"sha256=", b"sha\x00256=", 1)),
     ["RECORD"]),
    ("record-two-fields", lambda g, t: write(t / g.name, members(g).items(),
                                             record=record_text(members(g).items()) + b"a,b\n"),
     [f"!{RECORD}", "has 2 fields, not 3"]),
    ("record-twice", lambda g, t: write(t / g.name, members(g).items(),
                                        record=record_text(members(g).items()) * 2),
     ["is listed twice in RECORD", "Field `RECORD`"]),
    ("record-md5", lambda g, t: rewritten(g, t, algorithm="md5"), [f"!{SHARD}", "'md5'", "sha256 or stronger"]),
    ("record-sha1", lambda g, t: rewritten(g, t, algorithm="sha1"), ["'sha1'", "sha256 or stronger"]),
    ("record-sha224", lambda g, t: rewritten(g, t, algorithm="sha224"), ["'sha224'", "sha256 or stronger"]),
    ("record-unknown-hash", lambda g, t: write(t / g.name, members(g).items(),
                                               record=record_text(members(g).items()).replace(b"sha256=", b"sha999=")),
     ["'sha999'", "Field `RECORD`"]),
    ("record-size-wrong", lambda g, t: write(t / g.name, members(g).items(),
                                             record=record_text(members(g).items()).replace(b"\n", b"1\n", 1)),
     ["does not match its RECORD line (size", "Field `RECORD`"]),
    ("record-no-hash", lambda g, t: write(t / g.name, members(g).items(), record=b"".join(
        (line.split(b",")[0] + b",,\n") for line in record_text(members(g).items()).splitlines())),
     ["has RECORD hash '(none)'"]),
    ("ep-missing", lambda g, t: rewritten(g, t, lambda m: m.pop(EPS)),
     [f"!{MANIFEST}", "no entry point in group flytune.bundles names this bundle"]),
    ("ep-other-group", lambda g, t: rewritten(g, t, entry_points("[console_scripts]\nfixpkg = fixpkg._flytune\n")),
     ["no entry point in group flytune.bundles names this bundle"]),
    ("ep-substring", lambda g, t: rewritten(g, t, entry_points("[flytune.bundles]\nfixpkg = fixpkg._flytune_x\n"
                                                               "# fixpkg._flytune\n")),
     ["names 'fixpkg._flytune_x'", "Field `flytune.bundles.fixpkg`"]),
    ("ep-with-attr", lambda g, t: rewritten(g, t, entry_points("[flytune.bundles]\nfixpkg = fixpkg._flytune:x\n")),
     ["is 'fixpkg._flytune:x', not a dotted module name", "Field `flytune.bundles.fixpkg`"]),
    ("ep-default-section", lambda g, t: rewritten(g, t, entry_points("[DEFAULT]\nfixpkg = fixpkg._flytune\n")),
     ["no entry point in group flytune.bundles names this bundle"]),
    ("ep-not-utf8", lambda g, t: rewritten(g, t, lambda m: m.__setitem__(EPS, b"[flytune.bundles]\nx = \xff\n")),
     [f"!{EPS}", "not valid UTF-8"]),
    ("ep-no-equals", lambda g, t: rewritten(g, t, entry_points("[flytune.bundles]\nfixpkg fixpkg._flytune\n")),
     [f"!{EPS}", "cannot be parsed by importlib.metadata"]),
    ("ep-wrong-package", lambda g, t: rewritten(g, t, entry_points("[flytune.bundles]\nfixpkg = other._flytune\n")),
     ["names 'other._flytune', but the wheel has no other/_flytune/manifest.json"]),
    ("bundle-moved", lambda g, t: rewritten(g, t, _moved_keep_package),
     ["it must be exactly fixpkg._flytune"]),
    ("manifest-over-cap", lambda g, t: rewritten(g, t, padded_manifest), [f"!{MANIFEST}", "over the"]),
    ("shard-deleted", lambda g, t: rewritten(g, t, lambda m: m.pop(SHARD)), [f"!{SHARD}", "absent"]),
    ("control-chars", lambda g, t: write(t / g.name, [*members(g).items(), ("fixpkg/\x1b[2Jx\n\u202eyp.py", b"x")],
                                         record=record_text(members(g).items())),
     ["fixpkg/\\x1b[2Jx\\n\\u202eyp.py", "missing from RECORD"]),
]


def raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _drop(path: Path, name: str) -> Path:
    m = {}
    with zipfile.ZipFile(path) as zf:
        m = {n: zf.read(n) for n in zf.namelist() if n != name}
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in m.items():
            zf.writestr(n, d)
    return path


def _moved_keep_package(m):
    """The bundle under other/_flytune/ with the entry point naming it, its manifest still fixpkg's."""
    for n in [n for n in m if n.startswith("fixpkg/_flytune/")]:
        m[n.replace("fixpkg/", "other/", 1)] = m.pop(n)
    m[EPS] = b"[flytune.bundles]\nfixpkg = other._flytune\n"


@pytest.mark.parametrize("case,build,fragments", CASES, ids=[c[0] for c in CASES])
def test_hostile_wheel_is_a_clear_violation(good, tmp_path, case, build, fragments):
    whl = build(good, tmp_path)
    before = hashlib.sha256(whl.read_bytes()).hexdigest()
    r = flytune("verify", whl)
    assert r.returncode == 1, r.stdout + r.stderr
    for fragment in fragments:
        assert fragment in r.stdout, (fragment, r.stdout)
    assert all(c == "\n" or c.isprintable() for c in r.stdout), r.stdout  # names escaped, never raw
    j = flytune("verify", "--json", whl)
    doc = json.loads(j.stdout)  # JSON stays JSON, whatever the names hold
    assert j.returncode == 1 and doc["ok"] is False and doc["reports"][0]["errors"]
    assert hashlib.sha256(whl.read_bytes()).hexdigest() == before  # read only


def test_members_outside_the_bundle_may_differ_by_case_as_the_package_likes(good, tmp_path):
    whl = write(tmp_path / good.name, [*members(good).items(), ("fixpkg/README", b"a"), ("fixpkg/readme", b"b"),
                                      ("fixpkg/stra\u00dfe.py", b"c"), ("fixpkg/strasse.py", b"d")])
    r = flytune("verify", whl)
    assert r.returncode == 0 and "differs only in case" not in r.stdout, r.stdout


def test_corpus_of_wheel_cases_is_large():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", ["dotdot-member", "encrypted-flag", "corrupt-deflate", "record-huge-field",
                                  "ep-substring", "no-bundle", "invalid-utf8-name"])
def test_inspect_and_diff_are_hardened_alike(good, tmp_path, case):
    build = next(c[1] for c in CASES if c[0] == case)
    whl = build(good, tmp_path)
    r = flytune("inspect", whl)
    assert r.returncode == 1 and "error:" in r.stdout
    r = flytune("inspect", "--json", whl)
    assert r.returncode == 1 and json.loads(r.stdout)["errors"]
    r = flytune("diff", good, whl)
    assert r.returncode == 1 and "flytune: error:" in r.stderr


@pytest.mark.parametrize("algorithm", ["sha256", "sha384", "sha512", "blake2b", "blake2s", "sha3_256", "sha3_512"])
def test_every_hash_the_wheel_spec_allows_verifies(good, tmp_path, algorithm):
    whl = rewritten(good, tmp_path, algorithm=algorithm)
    r = flytune("verify", whl)
    assert r.returncode == 0 and ": ok;" in r.stdout, r.stdout


def test_a_tampered_member_is_caught_in_any_allowed_algorithm(good, tmp_path):
    m = members(good)
    items = list(m.items())
    record = record_text(items, "sha512")
    m["fixpkg/__init__.py"] = m["fixpkg/__init__.py"] + b"#"
    whl = write(tmp_path / good.name, m.items(), record=record)
    r = flytune("verify", whl)
    assert r.returncode == 1 and "fixpkg/__init__.py: Field `RECORD` does not match its RECORD line (size" in r.stdout


def test_editable_wheel_bundle_is_found_where_the_runtime_looks(good, tmp_path):
    def editable(m):
        for n in [n for n in m if n.startswith("fixpkg/_flytune/")]:
            m[n.replace("fixpkg/_flytune/", "__flytune_editable__/fixpkg/", 1)] = m.pop(n)
        m[EPS] = b"[flytune.bundles]\nfixpkg = __flytune_editable__.fixpkg\n"
    r = flytune("verify", rewritten(good, tmp_path, editable))
    assert r.returncode == 0, r.stdout


def test_huge_member_is_hashed_as_a_stream(good, tmp_path):
    """A ~1 MB wheel holding a 1 GiB member: verified in bounded memory (not 2 GB)."""
    m = members(good)
    whl = tmp_path / good.name
    size, chunk = 1 << 30, b"\0" * (1 << 20)
    zeros = bytes.fromhex("49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14")  # sha256(1 GiB of 0)
    big = f"fixpkg/big.bin,sha256={base64.urlsafe_b64encode(zeros).rstrip(b'=').decode()},{size}\n".encode()
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in m.items():
            zf.writestr(n, d)
        info = zipfile.ZipInfo("fixpkg/big.bin")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as fh:
            for _ in range(size >> 20):
                fh.write(chunk)
        zf.writestr(RECORD, big + record_text(m.items()))
    assert whl.stat().st_size < 4 << 20
    code = ("import resource, sys; from flytune_build.cli.main import main; rc = main(['verify', sys.argv[1]]); "
            "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")

    def peak_kib(wheel):
        r = subprocess.run([sys.executable, "-c", code, str(wheel)], capture_output=True, text=True,
                           env=python_env(), timeout=600, check=False)  # a gigabyte inflated: seconds, or more
        assert r.returncode == 0 and ": ok;" in r.stdout, r.stdout + r.stderr
        return int(r.stdout.split("MAXRSS")[1])

    # against the same process verifying the wheel without the member: whatever else the environment
    # loads, holding the member (1 GiB, twice over for a read-then-hash) would add over 1 GiB
    extra = peak_kib(whl) - peak_kib(good)
    assert extra < 256 << 10, f"{extra} KiB more than the wheel without the member"


def test_huge_bundle_member_is_refused_at_its_cap_unread(good, tmp_path):
    m = members(good)
    whl = tmp_path / good.name
    size = (256 << 20) + 1
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in m.items():
            if n != SHARD:
                zf.writestr(n, d)
        info = zipfile.ZipInfo(SHARD)
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as fh:
            fh.write(b" " * size)
        zf.writestr(RECORD, record_text([(n, d) for n, d in m.items() if n != SHARD]))
    r = flytune("verify", whl)
    assert r.returncode == 1 and f"{SHARD}: is {size} bytes, over the {256 << 20}-byte cap" in r.stdout, r.stdout


def test_deep_never_imports_a_package_the_wheel_does_not_install(good, tmp_path):
    """A manifest naming another package: --deep refuses it instead of importing what the data names."""
    (tmp_path / "mods").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "mods" / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    whl = rewritten(good, tmp_path, move_bundle("evilmod"))
    r = flytune("verify", whl)  # the bundle is where its entry point says, in a package the wheel lacks
    assert r.returncode == 1 and "places a bundle under package 'evilmod', which this wheel does not" in r.stdout
    r = flytune("verify", "--deep", whl, PYTHONPATH=tmp_path / "mods")
    assert r.returncode == 1 and "'evilmod'" in r.stdout, r.stdout
    assert not marker.exists()


def test_deep_on_a_directory_of_artifacts_imports_nothing(tmp_path):
    from buildkit import artifact

    marker = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    artifact(kernel="evilmod.add").save(tmp_path / "arts")
    r = flytune("verify", "--deep", tmp_path / "arts", PYTHONPATH=tmp_path / "mods")
    assert r.returncode == 1 and "declares no package" in r.stdout and not marker.exists()


def test_a_manifest_triton_range_that_is_no_specifier_is_a_typed_error(tmp_path, good):
    """`toolchain.triton` is held to `[tool.flytune] triton`'s rule, never handed to `packaging` unchecked."""
    m = members(good)
    name = next(n for n in m if n.endswith("_flytune/manifest.json"))
    doc = json.loads(m[name])
    doc["toolchain"]["triton"] = "garbage!!"
    m[name] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    bad = write(tmp_path / good.name, m.items())
    for command in ("verify", "inspect"):
        r = flytune(command, "--json", bad)
        assert r.returncode == 1 and "flytune: error:" not in r.stderr and "InvalidSpecifier" not in r.stderr, r.stderr
        assert "toolchain.triton" in r.stdout
