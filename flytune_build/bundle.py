"""The bundle inside a wheel: `<package>/_flytune/manifest.json` plus one shard per kernel.

The build writes it; the runtime and `flytune verify` read it. A shard is trusted only after its
sha256 matches the manifest.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from . import codec
from .artifact import KERNEL_NAME, Artifact, Provenance
from .codec import Fields
from .errors import BundleError
from .target import Target, parse_targets

FORMAT_VERSION = 1
DIRNAME = "_flytune"
MANIFEST = "manifest.json"
ENTRY_POINT_GROUP = "flytune.bundles"
SHARD_NAME = re.compile(r"[A-Za-z0-9_.]{1,220}\.json")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_SHARD_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardInfo:
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

    def to_json(self) -> dict:
        return {
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
    def from_bytes(cls, data: bytes, *, file: object) -> "Manifest":
        doc = codec.loads(data, file=file, error=BundleError)
        f = Fields(file, BundleError)
        f.table(doc, "", ("format", "package", "targets", "toolchain", "kernels", "coverage"))
        if isinstance(doc["format"], bool) or doc["format"] != FORMAT_VERSION:
            f.fail("format", f"is unknown manifest format {doc['format']!r} (this flytune reads {FORMAT_VERSION})")
        package = f.string(doc["package"], "package", KERNEL_NAME, "a dotted package name")
        targets = parse_targets(doc["targets"], f, "targets")
        tc = f.table(doc["toolchain"], "toolchain", ("triton", "tuned_with"))
        triton = tc["triton"] if tc["triton"] is None else f.string(tc["triton"], "toolchain.triton")
        tuned = f.mapping(tc["tuned_with"], "toolchain.tuned_with")
        for tool, versions in tuned.items():
            f.array(versions, f"toolchain.tuned_with.{tool}", lambda v, p: f.string(v, p, max_len=128))
        kernels = {}
        for name, info in f.mapping(doc["kernels"], "kernels").items():
            path = f"kernels.{name}"
            f.string(name, path, KERNEL_NAME, "a dotted kernel name", 200)
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
            coverage = tuple(f.array(coverage, "coverage", lambda v, p: f.string(v, p, KERNEL_NAME, "a kernel name", 200)))
        elif coverage not in ("all", "none"):
            f.fail("coverage", f"must be \"all\", \"none\" or a list of kernel names, not {coverage!r}")
        return cls(package, targets, triton, tuned, kernels, coverage)


def shard_name(kernel: str) -> str:
    return f"{kernel}.json"


def provenance_name(kernel: str) -> str:
    return f"{kernel}.provenance.json"


def shard_bytes(kernel: str, artifacts: list[Artifact]) -> bytes:
    docs = [{**a.identity(), "config": a.config.to_json()} for a in sorted(artifacts, key=lambda a: a.address)]
    return codec.canonical({"format": FORMAT_VERSION, "kernel": kernel, "artifacts": docs}) + b"\n"


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
                provenance: dict | None = None) -> list[Any]:
    """Artifact documents of a hash-checked shard; `full` validates each one as an Artifact."""
    _check(data, info.sha256, file=file, field=f"kernels.{info.kernel}.sha256")
    # the hash pins the bytes the build wrote (canonical: no duplicate keys, no NaN), so the fast
    # parser is exact here; a build verified the artifacts, `full` re-checks each one anyway
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BundleError(f"is not valid JSON: {e}", file=file) from None
    f = Fields(file, BundleError)
    f.table(doc, "", ("format", "kernel", "artifacts"))
    if doc["format"] != FORMAT_VERSION or doc["kernel"] != info.kernel:
        f.fail("kernel", f"must be shard format {FORMAT_VERSION} of {info.kernel!r}")
    docs = f.array(doc["artifacts"], "artifacts", lambda v, p: f.mapping(v, p), max_items=10_000_000)
    if not full:
        return docs
    out = []
    for i, d in enumerate(docs):
        if "provenance" in d:
            f.fail(f"artifacts[{i}].provenance", "belongs in the provenance file, not the shard")
        art = Artifact.from_json(d, file=f"{file}#artifacts[{i}]")
        if provenance and art.address in provenance:
            art = Artifact.from_json({**d, "provenance": provenance[art.address]}, file=f"{file}#artifacts[{i}]")
        out.append(art)
    return out


def parse_provenance(info: ShardInfo, data: bytes, *, file: object) -> dict:
    _check(data, info.provenance_sha256, file=file, field=f"kernels.{info.kernel}.provenance_sha256")
    doc = codec.loads(data, file=file, error=BundleError, max_bytes=MAX_SHARD_BYTES)
    f = Fields(file, BundleError)
    f.table(doc, "", ("format", "kernel", "provenance"))
    return f.mapping(doc["provenance"], "provenance")
