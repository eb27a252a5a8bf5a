"""The artifact, format version 1: "for kernel K, key values V, on device D, use config C".

Identity = (format, kernel, key, device); the content address is sha256 of its canonical JSON.
Provenance (versions, time, every candidate's timing) never enters the identity.
Nothing read from an artifact is ever executed or imported.
The build reads artifacts faster through `flytune_build.pipeline.reader`, which accepts exactly what
`Artifact.from_bytes(..., canonical=True)` accepts.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from . import choice, codec, inductor, specialization
from .codec import Fields
from .config import Config, check_json
from .device import DeviceIdentity
from .errors import ArtifactError
from .fsutil import read_regular
from .options import BY_NAME as OPTION

FORMAT_VERSION = 1
KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
KERNEL_NAME_MAX = 200  # characters: a kernel's files (`<kernel>-<address>.json`) stay within file-name limits


def kernel_name(value, f: Fields, path: str) -> str:
    """A kernel name, checked: a dotted Python name of at most KERNEL_NAME_MAX characters."""
    return f.string(value, path, KERNEL_NAME, "a dotted Python name (e.g. pkg.rmsnorm)", KERNEL_NAME_MAX)
AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FILE_NAME = re.compile(r"(?P<kernel>.+)-(?P<address>[0-9a-f]{16})\.json")
TOOLS = ("triton", "torch", "cuda", "hip")  # the toolchain a winner was found with, as provenance names it
PROVENANCE_FIELDS = ("flytune", *TOOLS, "created", "space_hash", "ranking",
                     "candidates", "host", "worker", "specialization",  # specialization: core.specialization
                     "measurement", "selection",  # how the winner was timed and chosen: core.choice
                     "outputs",  # what the candidates' outputs were checked against: core.choice
                     "source",  # where an imported config came from (file and entry)
                     "by_hand",  # why a maintainer chose this config by hand (`verify --deep` shows it)
                     "inductor")  # an Inductor kernel's name, size hints and compile mode: core.inductor
RANKINGS = ("measured", "synthetic", "imported")


@dataclass(frozen=True)
class Artifact:
    kernel: str
    key: Mapping[str, Any]
    device: DeviceIdentity
    config: Config
    provenance: Mapping[str, Any] | None = field(default=None, compare=False)

    def identity(self) -> dict:
        return {"format": FORMAT_VERSION, "kernel": self.kernel, "key": dict(self.key),
                "device": self.device.to_json()}

    @cached_property
    def address(self) -> str:
        return hashlib.sha256(codec.canonical(self.identity())).hexdigest()

    @property
    def filename(self) -> str:
        return f"{self.kernel}-{self.address[:16]}.json"

    def key_axes(self) -> tuple[str, ...]:
        return tuple(sorted(self.key))

    def to_json(self) -> dict:
        doc = {**self.identity(), "config": self.config.to_json()}
        if self.provenance is not None:
            doc["provenance"] = dict(self.provenance)
        return doc

    def to_bytes(self) -> bytes:
        return codec.canonical(self.to_json()) + b"\n"

    @classmethod
    def from_json(cls, doc: Any, *, file: object = None) -> Artifact:
        f = Fields(file, ArtifactError)
        f.table(doc, "", ("format", "kernel", "key", "device", "config"), ("provenance",))
        version = doc["format"]
        if isinstance(version, bool) or not isinstance(version, int):
            f.fail("format", f"must be an integer, not {codec.kind(version)}")
        if version != FORMAT_VERSION:
            f.fail("format", f"is unknown format version {version} (this flytune reads {FORMAT_VERSION})")
        kernel = kernel_name(doc["kernel"], f, "kernel")
        key = f.mapping(doc["key"], "key")
        if len(key) > 64:
            f.fail("key", "must have at most 64 axes")
        for axis, value in key.items():
            f.string(axis, "key", AXIS_NAME, f"an identifier naming a kernel parameter (axis {axis!r})", 128)
            f.scalar(value, f"key.{axis}")
            if isinstance(value, str) and len(value) > 256:
                f.fail(f"key.{axis}", "must be at most 256 characters")
        device = DeviceIdentity.from_json(doc["device"], f)
        config = Config.from_json(doc["config"], f)
        provenance = doc.get("provenance")
        if provenance is not None:
            _check_provenance(provenance, f, config)
        return cls(kernel, key, device, config, provenance)

    @classmethod
    def from_bytes(cls, data: bytes, *, file: object = None, check_name: bool = True,
                   canonical: bool = False) -> Artifact:
        not_canonical = False
        if canonical:
            try:
                doc = codec.loads_canonical(data, file=file, error=ArtifactError)
            except codec.NotCanonical as e:
                doc, not_canonical = e.doc, True
        else:
            doc = codec.loads(data, file=file, error=ArtifactError)
        art = cls.from_json(doc, file=file)
        if check_name and file is not None:
            art.check_file_name(file)
        if not_canonical:
            raise ArtifactError("is not in canonical form (sorted keys, fixed separators, one trailing "
                                "newline); rewrite it with `flytune fmt`", file=file, field="<document>")
        return art

    def check_file_name(self, file: object) -> None:
        """Raise unless `file` is named for this artifact's content address."""
        name = os.path.basename(str(file))
        if name != self.filename:
            raise ArtifactError(f"does not match the content address: expected file name "
                                f"{self.filename!r}, found {name!r} (edited by hand or renamed?)",
                                file=file, field="<file name>")

    def with_provenance(self, provenance: Mapping[str, Any] | None) -> Artifact:
        """The same artifact with another provenance (it never enters the identity)."""
        return Artifact(self.kernel, self.key, self.device, self.config, provenance)

    @classmethod
    def load(cls, path: str | os.PathLike, *, canonical: bool = False) -> Artifact:
        return cls.from_bytes(read_capped(path, ArtifactError), file=path, canonical=canonical)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write atomically; returns the path. Same identity, same file name."""
        from .fsutil import atomic_write

        path = Path(directory) / self.filename
        atomic_write(path, self.to_bytes())
        return path


class Provenance(Mapping):
    """An artifact's checked provenance, held as the canonical bytes it was read from.

    The build copies those bytes into the bundle as they are, instead of re-encoding every
    candidate's timing; the small fields stay decoded, the candidate list is decoded on first use.
    `Provenance(raw, head)` trusts its caller: `raw` is the canonical JSON of a provenance object
    already checked whole, `head` that object's fields but "candidates", decoded.
    """

    __slots__ = ("_doc", "_head", "raw")

    def __init__(self, raw: bytes, head: dict):
        self.raw = raw        # canonical JSON of the whole provenance object
        self._head = head     # every field but "candidates"
        self._doc = None

    def _full(self) -> dict:
        if self._doc is None:
            self._doc = json.loads(self.raw)  # the bytes were checked when the artifact was read
        return self._doc

    def __getitem__(self, name: str) -> Any:
        if name in self._head:
            return self._head[name]
        if name != "candidates":
            raise KeyError(name)
        return self._full()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())

    def __bool__(self) -> bool:
        return True  # a checked provenance is an object; its fields need not be decoded to say so

    def __repr__(self) -> str:
        return f"Provenance({self._full()!r})"

    def __reduce__(self):  # cheap to pass between processes: bytes and a few strings
        return (Provenance, (self.raw, self._head))


def read_capped(path, error, cap: int = codec.MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `cap` of them (`fsutil.read_regular`)."""
    return read_regular(path, error, cap)


def _check_provenance(p: Any, f: Fields, config: Config) -> None:
    f.table(p, "provenance", (), PROVENANCE_FIELDS)
    for name in ("flytune", *TOOLS, "created", "host", "worker"):  # host, worker: fleet runs
        if p.get(name) is not None:
            f.string(p[name], f"provenance.{name}", max_len=128)
    if p.get("source") is not None:
        f.string(p["source"], "provenance.source", max_len=1024)
    if p.get("by_hand") is not None:
        f.string(p["by_hand"], "provenance.by_hand", max_len=1024)
    if p.get("space_hash") is not None:
        f.string(p["space_hash"], "provenance.space_hash", re.compile(r"[0-9a-f]{64}"), "a sha256 hex digest")
    if p.get("ranking") is not None and p["ranking"] not in RANKINGS:
        f.fail("provenance.ranking", f"must be one of {', '.join(RANKINGS)}, not {p['ranking']!r}")
    if p.get("specialization") is not None:
        specialization.check(p["specialization"], f, config_kwargs=config.kwargs, closed=False)
    if p.get("measurement") is not None:
        choice.check_measurement(p["measurement"], f)
    if p.get("selection") is not None:
        choice.check_selection(p["selection"], f)
    if p.get("outputs") is not None:
        choice.check_outputs(p["outputs"], f)
    if p.get("inductor") is not None:
        inductor.check_provenance(p["inductor"], f)

    def candidate(v, path):
        if _plain_candidate(v):
            return
        f.table(v, path, ("config", "time_ms"), ("error",))
        check_json(v["config"], f, f"{path}.config")
        f.number(v["time_ms"], f"{path}.time_ms", nullable=True)
        if "error" in v:
            f.string(v["error"], f"{path}.error", max_len=4096)

    if "candidates" in p:
        cands = p["candidates"]
        if not (type(cands) is list and len(cands) <= 4096 and all(map(_plain_candidate, cands))):
            f.array(cands, "provenance.candidates", candidate, max_items=4096)


def _plain_candidate(v: Any) -> bool:
    """The common, valid candidate, checked without building error paths (a bundle holds thousands)."""
    if type(v) is not dict or len(v) != 2 or "config" not in v:
        return False
    t = v.get("time_ms", 0)
    if not (t is None or (type(t) in (int, float) and -codec.FLOAT_MAX <= t <= codec.FLOAT_MAX)):
        return False
    c = v["config"]
    return type(c) is dict and _plain_config(c)


def _plain_config(c: dict) -> bool:
    if type(c.get("kwargs")) is not dict:
        return False
    for k, x in c.items():
        if k != "kwargs" and (k not in OPTION or not OPTION[k].accepts(x)):
            return False
    for k, x in c["kwargs"].items():
        if type(x) not in (int, str, bool) or not AXIS_NAME.fullmatch(k) or k in OPTION:
            return False
        if type(x) is int and abs(x) > 2 ** 63:
            return False
    return True


def load_dir(directory: str | os.PathLike, *, canonical: bool = False) -> list[Artifact]:
    """Every `*.json` artifact directly under `directory`, sorted by file name."""
    return [Artifact.load(p, canonical=canonical) for p in sorted(Path(directory).glob("*.json"))]
