"""The bundle inside a wheel: `<package>/_flytune/manifest.json` plus one shard per kernel.

The build writes it; the runtime and `flytune verify` read it. A shard is trusted only after its
sha256 matches the manifest.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import codec, serving
from .artifact import KERNEL_NAME, KERNEL_NAME_MAX, Artifact, Provenance, kernel_name
from .codec import Fields
from .errors import BundleError, FlytuneError
from .specifier import SPECIFIER_RE
from .target import Target, parse_targets

FORMAT_VERSION = 1
DIRNAME = serving.DIRNAME
MANIFEST = "manifest.json"
ENTRY_POINT_GROUP = "flytune.bundles"
SHARD_NAME = re.compile(r"[A-Za-z0-9_.]{1,220}\.json")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_SHARD_BYTES = 256 << 20
MAX_MANIFEST_BYTES = codec.MAX_DOCUMENT_BYTES


class ShardInfo(NamedTuple):  # a tuple: the runtime makes one per kernel of every bundle it finds
    kernel: str
    shard: str                 # identities and configs: all the runtime reads
    sha256: str
    artifacts: int
    axes: tuple[str, ...]
    provenance: str            # versions and every candidate's timing: read by verify, inspect, diff
    provenance_sha256: str


@dataclass(frozen=True)
class Manifest:
    package: str
    targets: tuple[Target, ...]
    triton: str | None
    tuned_with: dict
    kernels: dict[str, ShardInfo]
    coverage: str | tuple[str, ...] = "all"
    packs: tuple[str, ...] = ()  # distributions whose config packs may serve this package's kernels

    def to_json(self) -> dict:
        packs = {"packs": list(self.packs)} if self.packs else {}  # absent when none: older readers read it
        return {**packs,
            "format": FORMAT_VERSION,
            "package": self.package,
            "targets": [t.to_json() for t in self.targets],
            "coverage": self.coverage if isinstance(self.coverage, str) else list(self.coverage),
            "toolchain": {"triton": self.triton, "tuned_with": self.tuned_with},
            "kernels": {k: {"shard": s.shard, "sha256": s.sha256, "artifacts": s.artifacts,
                            "axes": list(s.axes), "provenance": s.provenance,
                            "provenance_sha256": s.provenance_sha256} for k, s in sorted(self.kernels.items())},
        }

    def to_bytes(self) -> bytes:
        return codec.canonical(self.to_json()) + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, *, file: object) -> Manifest:
        try:  # a build writes it canonical: then the C parser is exact (no duplicate keys, no NaN)
            doc = codec.loads_canonical(data, file=file, error=BundleError)
        except codec.NotCanonical as e:
            doc = e.doc  # read strictly all the same
        f = Fields(file, BundleError)
        f.table(doc, "", ("format", "package", "targets", "toolchain", "kernels", "coverage"), ("packs",))
        if isinstance(doc["format"], bool) or doc["format"] != FORMAT_VERSION:
            f.fail("format", f"is unknown manifest format {doc['format']!r} (this flytune reads {FORMAT_VERSION})")
        package = f.string(doc["package"], "package", KERNEL_NAME, "a dotted package name")
        targets = parse_targets(doc["targets"], f, "targets")
        tc = f.table(doc["toolchain"], "toolchain", ("triton", "tuned_with"))
        triton = tc["triton"] if tc["triton"] is None else f.string(
            tc["triton"], "toolchain.triton", SPECIFIER_RE, 'a PEP 440 version specifier such as ">=3.4,<4"')
        tuned = f.mapping(tc["tuned_with"], "toolchain.tuned_with")
        for tool, versions in tuned.items():
            f.array(versions, f"toolchain.tuned_with.{tool}", lambda v, p: f.string(v, p, max_len=128))
        kernels = {}
        for name, info in f.mapping(doc["kernels"], "kernels").items():
            entry = _plain_entry(name, info)
            if entry is not None:
                kernels[name] = entry
                continue
            path = f"kernels.{name}"
            kernel_name(name, f, path)
            f.table(info, path, ("shard", "sha256", "artifacts", "axes", "provenance", "provenance_sha256"))
            kernels[name] = ShardInfo(
                name, f.string(info["shard"], f"{path}.shard", SHARD_NAME, "a plain file name ending .json"),
                f.string(info["sha256"], f"{path}.sha256", SHA256, "a sha256 hex digest"),
                f.integer(info["artifacts"], f"{path}.artifacts", 0),
                tuple(f.array(info["axes"], f"{path}.axes", lambda v, p: f.string(v, p, max_len=128))),
                f.string(info["provenance"], f"{path}.provenance", SHARD_NAME, "a plain file name ending .json"),
                f.string(info["provenance_sha256"], f"{path}.provenance_sha256", SHA256, "a sha256 hex digest"))
        coverage = doc["coverage"]
        if isinstance(coverage, list):
            coverage = tuple(f.array(coverage, "coverage", lambda v, p: kernel_name(v, f, p)))
        elif coverage not in ("all", "none"):
            f.fail("coverage", f"must be \"all\", \"none\" or a list of kernel names, not {coverage!r}")
        packs = tuple(f.array(doc.get("packs", []), "packs",
                              lambda v, p: serving.normalize(f.string(v, p, serving.DIST_NAME, "a distribution name",
                                                                      128))))
        return cls(package, targets, triton, tuned, kernels, coverage, packs)


_ENTRY_FIELDS = frozenset(("shard", "sha256", "artifacts", "axes", "provenance", "provenance_sha256"))


def _plain_entry(name: str, info: Any) -> ShardInfo | None:
    """A valid manifest entry, checked without building error paths (a bundle may list hundreds of
    kernels and the runtime reads its manifest once per process); None sends it to the field-by-field
    check, which names the rule an invalid one breaks."""
    if not (type(info) is dict and info.keys() == _ENTRY_FIELDS and len(name) <= KERNEL_NAME_MAX and KERNEL_NAME.fullmatch(name)):
        return None
    shard, digest, prov, prov_digest = info["shard"], info["sha256"], info["provenance"], info["provenance_sha256"]
    count, axes = info["artifacts"], info["axes"]
    if (type(shard) is str and len(shard) <= 256 and SHARD_NAME.fullmatch(shard)
            and type(prov) is str and len(prov) <= 256 and SHARD_NAME.fullmatch(prov)
            and type(digest) is str and SHA256.fullmatch(digest)
            and type(prov_digest) is str and SHA256.fullmatch(prov_digest)
            and type(count) is int and count >= 0
            and type(axes) is list and len(axes) <= 100_000 and all(type(a) is str and len(a) <= 128 for a in axes)):
        return ShardInfo(name, shard, digest, count, tuple(axes), prov, prov_digest)
    return None


def shard_name(kernel: str) -> str:
    return f"{kernel}.json"


def provenance_name(kernel: str) -> str:
    return f"{kernel}.provenance.json"


_SCALAR_TYPES = frozenset(codec.JSON_SCALARS)
SHARD_FORMAT = 2  # a table: each distinct device and config once, then one row per artifact


class Shard(NamedTuple):
    """One kernel's identities and configs: `rows` are [device index, config index, *key values in
    `axes` order]; `devices` and `configs` hold each distinct document once."""
    kernel: str
    axes: tuple[str, ...]
    devices: list
    configs: list
    rows: list

    def doc(self, row: list) -> dict:
        """The artifact document (without provenance) that one row stands for."""
        return {"format": FORMAT_VERSION, "kernel": self.kernel, "key": dict(zip(self.axes, row[2:])),
                "device": self.devices[row[0]], "config": self.configs[row[1]]}


def shard_bytes(kernel: str, artifacts: list[Artifact]) -> bytes:
    arts = sorted(artifacts, key=lambda a: a.address)
    axes = sorted(arts[0].key) if arts else []
    devices: dict[bytes, int] = {}  # canonical document -> index (canonical: True and 1 stay apart)
    configs: dict[bytes, int] = {}
    device_docs, config_docs, rows = [], [], []
    for a in arts:
        if sorted(a.key) != axes:
            raise BundleError(f"has key axes {sorted(a.key)}, not the {axes} of the other artifacts in its shard", file=a.filename, field="key")
        d, c = a.device.to_json(), a.config.to_json()
        di = devices.setdefault(codec.canonical(d), len(devices))
        if di == len(device_docs):
            device_docs.append(d)
        ci = configs.setdefault(codec.canonical(c), len(configs))
        if ci == len(config_docs):
            config_docs.append(c)
        rows.append([di, ci, *[a.key[x] for x in axes]])
    return codec.canonical({"format": SHARD_FORMAT, "kernel": kernel, "axes": axes, "devices": device_docs,
                            "configs": config_docs, "artifacts": rows}) + b"\n"


def provenance_bytes(kernel: str, artifacts: list[Artifact]) -> bytes:
    """canonical({"format": 1, "kernel": kernel, "provenance": {address: provenance}}), joined from
    each artifact's canonical provenance bytes rather than re-encoding every candidate's timing."""
    raw = {a.address: a.provenance.raw if isinstance(a.provenance, Provenance) else codec.canonical(dict(a.provenance))
           for a in artifacts if a.provenance is not None}
    body = b",".join(b'"%s":%s' % (address.encode(), raw[address]) for address in sorted(raw))
    return b'{"format":%d,"kernel":%s,"provenance":{%s}}\n' % (FORMAT_VERSION, codec.canonical(kernel), body)


def _check(data: bytes, digest: str, *, file: object, field: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise BundleError(f"does not match the manifest: sha256 {actual[:16]}... != {digest[:16]}... "
                          f"(altered after the build)", file=file, field=field)


def parse_shard(info: ShardInfo, data: bytes, *, file: object, full: bool = False,
                provenance: dict | None = None) -> Shard | list[Artifact]:
    """The hash-checked shard's table; `full` gives its artifacts, each validated as an Artifact."""
    _check(data, info.sha256, file=file, field=f"kernels.{info.kernel}.sha256")
    # the hash pins the bytes the build wrote (canonical: no duplicate keys, no NaN), so the fast
    # parser is exact for a shard a build made; a verifier (`full`) reads it strictly all the same
    if full:  # a verifier: the strict reader (duplicate keys, non-finite numbers), whatever the hash says
        doc = codec.loads(data, file=file, error=BundleError, max_bytes=len(data))
    else:
        try:
            doc = json.loads(data)
        except RecursionError:
            raise BundleError("is not valid JSON: nested too deeply", file=file) from None
        except ValueError as e:
            raise BundleError(f"is not valid JSON: {codec.too_long(e)}", file=file) from None
        if b"\\u" in data and codec.lone_surrogate(doc) is not None:
            raise BundleError("holds a lone UTF-16 surrogate escape: not text", file=file,
                              field=codec.lone_surrogate(doc))
    f = Fields(file, BundleError)
    version = doc.get("format") if type(doc) is dict else None
    if version != SHARD_FORMAT or type(version) is not int:
        f.fail("format", f"is shard format {version!r}; this flytune reads format {SHARD_FORMAT} "
                         f"(the wheel was built by another flytune-build: rebuild it)")
    f.table(doc, "", ("format", "kernel", "axes", "devices", "configs", "artifacts"))
    if doc["kernel"] != info.kernel:
        f.fail("kernel", f"must be {info.kernel!r}, the kernel the manifest names")
    axes = tuple(f.array(doc["axes"], "axes", lambda v, p: f.string(v, p, max_len=128)))
    if axes != tuple(info.axes):
        f.fail("axes", f"must be the manifest's axes {list(info.axes)}, not {list(axes)}")
    devices = f.array(doc["devices"], "devices", f.mapping)
    configs = f.array(doc["configs"], "configs", f.mapping)
    rows = doc["artifacts"]
    width, nd, nc = 2 + len(axes), len(devices), len(configs)
    def good(r):
        return (type(r) is list and len(r) == width and type(r[0]) is int and 0 <= r[0] < nd
                and type(r[1]) is int and 0 <= r[1] < nc and all(type(v) in _SCALAR_TYPES for v in r[2:]))

    if not _good_rows(rows, width, nd, nc):
        f.array(rows, "artifacts", lambda r, p: r if good(r) else f.fail(
            p, f"must be [device index < {nd}, config index < {nc}, one JSON scalar per axis]"))
    shard = Shard(info.kernel, axes, devices, configs, rows)
    if not full:
        return shard
    out = []
    for i, row in enumerate(rows):
        d = shard.doc(row)
        art = Artifact.from_json(d, file=f"{file}#artifacts[{i}]")
        if provenance and art.address in provenance:
            art = Artifact.from_json({**d, "provenance": provenance[art.address]}, file=f"{file}#artifacts[{i}]")
        out.append(art)
    return out


def _good_rows(rows: Any, width: int, nd: int, nc: int) -> bool:
    """Whether every row is well formed, in a few passes over all rows at once (a kernel may hold
    thousands); a False sends the shard to the row-by-row check that names the first bad row."""
    if type(rows) is not list or not rows:
        return type(rows) is list
    if {type(r) for r in rows} != {list} or {len(r) for r in rows} != {width}:
        return False
    if {type(r[0]) for r in rows} != {int} or {type(r[1]) for r in rows} != {int}:
        return False  # (checked on the rows: a set of values would keep one of True and 1)
    devices, configs = {r[0] for r in rows}, {r[1] for r in rows}
    if min(devices) < 0 or max(devices) >= nd or min(configs) < 0 or max(configs) >= nc:
        return False
    return width == 2 or {type(v) for r in rows for v in r[2:]} <= _SCALAR_TYPES


def parse_provenance(info: ShardInfo, data: bytes, *, file: object) -> dict:
    _check(data, info.provenance_sha256, file=file, field=f"kernels.{info.kernel}.provenance_sha256")
    doc = codec.loads(data, file=file, error=BundleError, max_bytes=MAX_SHARD_BYTES)
    f = Fields(file, BundleError)
    f.table(doc, "", ("format", "kernel", "provenance"))
    return f.mapping(doc["provenance"], "provenance")


@dataclass
class Contents:
    """What `read` found in one bundle: its manifest (None when unreadable), the artifacts of every
    shard that checks out, the errors met on the way, and the size of each file read."""
    manifest: Manifest | None
    artifacts: list[Artifact] = field(default_factory=list)
    errors: list[FlytuneError] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)      # file name in the bundle -> bytes
    origin: dict[int, str] = field(default_factory=dict)     # id(artifact) -> "<shard>#artifacts[i]"

    def where(self, art: Artifact) -> str:
        """The shard row `art` came from."""
        return self.origin[id(art)]


def read(label: str, manifest_bytes: bytes, read_member: Callable[[str], bytes | None]) -> Contents:
    """Read a whole bundle, every artifact validated; `label` prefixes each file name in errors (a
    directory with its slash, or `wheel!package/_flytune/`) and `read_member(name)` gives a file's
    bytes, None when absent, or raises a FlytuneError (recorded, that kernel skipped). Coverage and
    toolchain are core.verification's to judge."""
    try:
        manifest = Manifest.from_bytes(manifest_bytes, file=label + MANIFEST)
    except FlytuneError as e:
        return Contents(None, errors=[e])
    got = Contents(manifest, sizes={MANIFEST: len(manifest_bytes)})
    for kernel, info in sorted(manifest.kernels.items()):
        where = label + info.shard
        try:  # a member that cannot be read (over its cap, not a regular file, corrupt) is a finding
            shard = read_member(info.shard)
            prov_blob = None if shard is None else read_member(info.provenance)
        except FlytuneError as e:
            got.errors.append(e)
            continue
        if shard is None:
            got.errors.append(BundleError("is named by the manifest but absent", file=where,
                                          field=f"kernels.{kernel}.shard"))
            continue
        got.sizes[info.shard] = len(shard)
        try:
            prov = {}
            if prov_blob is None:
                got.errors.append(BundleError("is named by the manifest but absent", file=label + info.provenance,
                                              field=f"kernels.{kernel}.provenance"))
            else:
                got.sizes[info.provenance] = len(prov_blob)
                prov = parse_provenance(info, prov_blob, file=label + info.provenance)
            arts = parse_shard(info, shard, file=where, full=True, provenance=prov)
        except FlytuneError as e:
            got.errors.append(e)
            continue
        for a in arts:
            if a.kernel != kernel:
                got.errors.append(BundleError(f"holds an artifact of {a.kernel}", file=where, field="artifacts"))
        if len(arts) != info.artifacts:
            got.errors.append(BundleError(f"holds {len(arts)} artifacts, the manifest says {info.artifacts}",
                                          file=where, field=f"kernels.{kernel}.artifacts"))
        got.origin.update((id(a), f"{where}#artifacts[{i}]") for i, a in enumerate(arts))
        got.artifacts.extend(arts)
    return got


def member_reader(root) -> Callable[[str], bytes | None]:
    """`read_member` for `read` over a bundle directory: each file through core.fsutil.read_regular
    (regular files only, the manifest's or a shard's cap), None when absent."""
    import os

    from .fsutil import read_regular

    def read_member(name: str) -> bytes | None:
        path = os.path.join(root, name)
        if not os.path.lexists(path):
            return None
        return read_regular(path, BundleError, MAX_MANIFEST_BYTES if name == MANIFEST else MAX_SHARD_BYTES)
    return read_member


def read_directory(root) -> Contents:
    """A whole bundle directory (`<package>/_flytune/`), every file read capped (`member_reader`)."""
    label = str(root).rstrip("/") + "/"
    try:
        manifest = member_reader(root)(MANIFEST)
    except FlytuneError as e:
        return Contents(None, errors=[e])
    if manifest is None:
        return Contents(None, errors=[BundleError("is absent", file=label + MANIFEST)])
    return read(label, manifest, member_reader(root))
