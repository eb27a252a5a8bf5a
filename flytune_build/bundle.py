"""The bundle inside a wheel: `<package>/_flytune/manifest.json` plus one shard per kernel.

The build writes it; the runtime and `flytune verify` read it. A shard is trusted only after its
sha256 matches the manifest.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from . import codec
from .artifact import KERNEL_NAME, Artifact
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
    shard: str
    sha256: str
    artifacts: int
    axes: tuple[str, ...]


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
                            "axes": list(s.axes)} for k, s in sorted(self.kernels.items())},
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
            f.table(info, path, ("shard", "sha256", "artifacts", "axes"))
            kernels[name] = ShardInfo(
                name, f.string(info["shard"], f"{path}.shard", SHARD_NAME, "a plain file name ending .json"),
                f.string(info["sha256"], f"{path}.sha256", SHA256, "a sha256 hex digest"),
                f.integer(info["artifacts"], f"{path}.artifacts", 0),
                tuple(f.array(info["axes"], f"{path}.axes", lambda v, p: f.string(v, p, max_len=128))))
        coverage = doc["coverage"]
        if isinstance(coverage, list):
            coverage = tuple(f.array(coverage, "coverage", lambda v, p: f.string(v, p, KERNEL_NAME, "a kernel name", 200)))
        elif coverage not in ("all", "none"):
            f.fail("coverage", f"must be \"all\", \"none\" or a list of kernel names, not {coverage!r}")
        return cls(package, targets, triton, tuned, kernels, coverage)


def shard_name(kernel: str) -> str:
    return f"{kernel}.json"


def shard_bytes(kernel: str, artifacts: list[Artifact]) -> bytes:
    docs = [a.to_json() for a in sorted(artifacts, key=lambda a: a.address)]
    return codec.canonical({"format": FORMAT_VERSION, "kernel": kernel, "artifacts": docs}) + b"\n"


def check_shard(info: ShardInfo, data: bytes, *, file: object) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise BundleError(f"does not match the manifest: sha256 {digest[:16]}... != {info.sha256[:16]}... "
                          f"(the shard was altered after the build)", file=file, field=f"kernels.{info.kernel}.sha256")


def parse_shard(info: ShardInfo, data: bytes, *, file: object, full: bool = False) -> list[Any]:
    """Artifact documents of a hash-checked shard; `full` validates each one as an Artifact."""
    check_shard(info, data, file=file)
    doc = codec.loads(data, file=file, error=BundleError, max_bytes=MAX_SHARD_BYTES)
    f = Fields(file, BundleError)
    f.table(doc, "", ("format", "kernel", "artifacts"))
    if doc["format"] != FORMAT_VERSION or doc["kernel"] != info.kernel:
        f.fail("kernel", f"must be shard format {FORMAT_VERSION} of {info.kernel!r}")
    docs = f.array(doc["artifacts"], "artifacts", lambda v, p: f.mapping(v, p), max_items=10_000_000)
    if full:
        return [Artifact.from_json(d, file=f"{file}#artifacts[{i}]") for i, d in enumerate(docs)]
    return docs
