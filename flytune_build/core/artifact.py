"""The artifact, format version 1: "for kernel K, key values V, on device D, use config C".

Identity = (format, kernel, key, device); the content address is sha256 of its canonical JSON.
Provenance (versions, time, every candidate's timing) never enters the identity.
Nothing read from an artifact is ever executed or imported.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping

from . import codec
from .codec import Fields
from .config import Config, check_json
from .device import DeviceIdentity
from .errors import ArtifactError

FORMAT_VERSION = 1
KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FILE_NAME = re.compile(r"(?P<kernel>.+)-(?P<address>[0-9a-f]{16})\.json")
PROVENANCE_FIELDS = ("flytune", "triton", "torch", "cuda", "hip", "created", "space_hash", "ranking",
                     "candidates")
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
    def from_json(cls, doc: Any, *, file: object = None) -> "Artifact":
        f = Fields(file, ArtifactError)
        f.table(doc, "", ("format", "kernel", "key", "device", "config"), ("provenance",))
        version = doc["format"]
        if isinstance(version, bool) or not isinstance(version, int):
            f.fail("format", f"must be an integer, not {codec._kind(version)}")
        if version != FORMAT_VERSION:
            f.fail("format", f"is unknown format version {version} (this flytune reads {FORMAT_VERSION})")
        kernel = f.string(doc["kernel"], "kernel", KERNEL_NAME, "a dotted Python name (e.g. pkg.rmsnorm)", 200)
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
            _check_provenance(provenance, f)
        return cls(kernel, key, device, config, provenance)

    @classmethod
    def from_bytes(cls, data: bytes, *, file: object = None, check_name: bool = True,
                   canonical: bool = False) -> "Artifact":
        not_canonical, raw = False, None
        if canonical and (tuned := _read_tuned(data)) is not None:
            doc, raw = tuned  # canonical, and its candidate list valid: checked without decoding it
        elif canonical:
            try:
                doc = codec.loads_canonical(data, file=file, error=ArtifactError)
            except codec.NotCanonical as e:
                doc, not_canonical = e.doc, True
        else:
            doc = codec.loads(data, file=file, error=ArtifactError)
        art = cls.from_json(doc, file=file)
        if raw is not None:
            art = cls(art.kernel, art.key, art.device, art.config, Provenance(raw, art.provenance))
        if check_name and file is not None:
            name = os.path.basename(str(file))
            if name != art.filename:
                raise ArtifactError(f"does not match the content address: expected file name "
                                    f"{art.filename!r}, found {name!r} (edited by hand or renamed?)",
                                    file=file, field="<file name>")
        if not_canonical:
            raise ArtifactError("is not in canonical form (sorted keys, fixed separators, one trailing "
                                "newline); rewrite it with `flytune fmt`", file=file, field="<document>")
        return art

    @classmethod
    def load(cls, path: str | os.PathLike, *, canonical: bool = False) -> "Artifact":
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
    """

    __slots__ = ("raw", "_head", "_doc")

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


# -- the fast reading of a tuned artifact -------------------------------------------------------------
# A build reads thousands of artifacts, each mostly its candidate list (every config's timing). That
# list is checked in C, against a regular grammar of the form `flytune tune` writes; every document
# this path accepts is valid and canonical. Anything else, and every invalid document, takes the
# strict path, which names the exact rule broken. tests/test_hardening.py checks the two agree.
_KW_KEY = rb'"(?!(?:num_warps|num_stages|num_ctas|maxnreg)")[A-Za-z_][A-Za-z0-9_]{0,127}"'
_KW_VALUE = rb'(?:0|-?[1-9][0-9]{0,17}|true|false|"[\x20\x21\x23-\x5b\x5d-\x7a\x7c\x7e]{0,256}")'
_KW = rb'\{(?:' + _KW_KEY + b":" + _KW_VALUE + rb'(?:,' + _KW_KEY + b":" + _KW_VALUE + rb')*)?\}'
_CONFIG = (rb'\{"kwargs":' + _KW + rb',"maxnreg":(?:null|[1-9][0-9]{0,2}|10[01][0-9]|102[0-4])'
           rb',"num_ctas":(?:[1-9]|1[0-6]),"num_stages":(?:[0-9]|1[0-6]),"num_warps":(?:[1-9]|[1-5][0-9]|6[0-4])\}')
_ERROR = rb'"(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f])){0,4096}"'
_TIME = rb'(?:null|-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,24})?(?:e[-+][0-9]{1,3})?)'
_CANDIDATE = rb'\{"config":' + _CONFIG + rb'(?:,"error":' + _ERROR + rb')?,"time_ms":' + _TIME + rb'\}'
_CANDIDATE_LIST = re.compile(rb'\[(?:' + _CANDIDATE + rb'(?:,' + _CANDIDATE + rb')*)?\]')
_TIMES = re.compile(rb',"time_ms":([^}]*)\}')
_KWARGS = re.compile(rb'"kwargs":(\{[^}]*\})')
_PROVENANCE_MARK = b',"provenance":{"candidates":['
_SORTED_KWARGS: set[bytes] = set()  # kwargs objects seen with sorted, unique keys


def _read_tuned(data: bytes) -> tuple[dict, bytes] | None:
    """(document whose provenance lacks the candidate list, provenance bytes) for a canonical
    artifact whose candidate list the grammar accepts; else None."""
    i = data.find(_PROVENANCE_MARK)
    if i < 0 or len(data) > codec.MAX_DOCUMENT_BYTES:
        return None
    start = i + len(_PROVENANCE_MARK) - 1
    m = _CANDIDATE_LIST.match(data, start)
    if m is None:
        return None
    end = m.end()
    try:
        data.decode("utf-8")  # the candidate list is never decoded, but must be UTF-8 all the same
        head_bytes = data[:i] + b"}"
        head = json.loads(head_bytes)
        if type(head) is not dict or max(head, default="") >= "provenance" or codec.canonical(head) != head_bytes:
            return None
        tail = data[end:]
        if tail == b"}}\n":
            rest = {}
        elif tail[:1] == b"," and tail[-3:] == b"}}\n":  # more provenance fields, each sorting after "candidates"
            rest_bytes = b"{" + tail[1:-2]
            rest = json.loads(rest_bytes)
            if type(rest) is not dict or min(rest) <= "candidates" or codec.canonical(rest) != rest_bytes:
                return None
        else:
            return None
        candidates = data[start:end]
        times = _TIMES.findall(candidates)
        if len(times) > 4096:
            return None
        joined = b"[" + b",".join(times) + b"]"  # each number as the canonical encoder writes it
        if codec.canonical(json.loads(joined)) != joined:
            return None
        for kwargs in set(_KWARGS.findall(candidates)) - _SORTED_KWARGS:
            names = [name for name, _ in json.loads(kwargs, object_pairs_hook=list)]
            if names != sorted(set(names)):
                return None
            if len(_SORTED_KWARGS) > 65536:
                _SORTED_KWARGS.clear()
            _SORTED_KWARGS.add(kwargs)
    except (ValueError, RecursionError):
        return None
    head["provenance"] = rest
    return head, data[i + 14:-2]  # the provenance object: after ',"provenance":', before the final '}\n'


def read_capped(path, error, cap: int = codec.MAX_DOCUMENT_BYTES) -> bytes:
    """The file's bytes, at most `cap` of them (a build reads thousands: one open, fstat, read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size > cap:
                raise error(f"is over the {cap}-byte cap", file=path)
            data = os.read(fd, (size or 65536) + 1)
            if not 0 < len(data) <= size:  # not a plain file read whole: read on, up to the cap
                chunks, n = [data], len(data)
                while n <= cap and (chunk := os.read(fd, min(65536, cap + 1 - n))):
                    chunks.append(chunk)
                    n += len(chunk)
                data = b"".join(chunks)
        finally:
            os.close(fd)
    except OSError as e:
        raise error(f"cannot be read: {e.strerror}", file=path) from None
    if len(data) > cap:
        raise error(f"is over the {cap}-byte cap", file=path)
    return data


def _check_provenance(p: Any, f: Fields) -> None:
    f.table(p, "provenance", (), PROVENANCE_FIELDS)
    for name in ("flytune", "triton", "torch", "cuda", "hip", "created"):
        if p.get(name) is not None:
            f.string(p[name], f"provenance.{name}", max_len=128)
    if p.get("space_hash") is not None:
        f.string(p["space_hash"], "provenance.space_hash", re.compile(r"[0-9a-f]{64}"), "a sha256 hex digest")
    if p.get("ranking") is not None and p["ranking"] not in RANKINGS:
        f.fail("provenance.ranking", f"must be one of {', '.join(RANKINGS)}, not {p['ranking']!r}")

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


_INT_OPTS = {"num_warps": (1, 64), "num_stages": (0, 16), "num_ctas": (1, 16)}


def _plain_candidate(v: Any) -> bool:
    """The common, valid candidate, checked without building error paths (a bundle holds thousands)."""
    if type(v) is not dict or len(v) != 2 or "config" not in v:
        return False
    t = v.get("time_ms", 0)
    if not (t is None or (type(t) in (int, float) and t == t and t not in (math.inf, -math.inf))):
        return False
    c = v["config"]
    return type(c) is dict and _plain_config(c)


def _plain_config(c: dict) -> bool:
    if type(c.get("kwargs")) is not dict:
        return False
    for k, x in c.items():
        if k in _INT_OPTS:
            lo, hi = _INT_OPTS[k]
            if type(x) is not int or not lo <= x <= hi:
                return False
        elif k == "maxnreg":
            if x is not None and (type(x) is not int or not 1 <= x <= 1024):
                return False
        elif k != "kwargs":
            return False
    for k, x in c["kwargs"].items():
        if type(x) not in (int, str, bool) or not AXIS_NAME.fullmatch(k) or k in _INT_OPTS or k == "maxnreg":
            return False
        if type(x) is int and abs(x) > 2 ** 63:
            return False
    return True


def load_dir(directory: str | os.PathLike, *, canonical: bool = False) -> list[Artifact]:
    """Every `*.json` artifact directly under `directory`, sorted by file name."""
    return [Artifact.load(p, canonical=canonical) for p in sorted(Path(directory).glob("*.json"))]
