"""FlyDSL's offline-config format: flytune artifacts written as FlyDSL files (`to_flydsl`, `export`) and
FlyDSL's files read as artifacts (`from_flydsl`); pure, no FlyDSL, torch or triton.

FlyDSL's format (flydsl/autotune.py, artifact version 1): a file
`<artifact_name>-<sha256 of the canonical identity>.json` holding
`{"version": 1, "identity": {"name", "key", "device": {"name", "arch", "compute_units"}},
"config": {<kwargs>, "num_warps"?, "waves_per_eu"?}}`, where the canonical form is
`json.dumps(sort_keys=True, separators=(",", ":"), allow_nan=False)` (ASCII-escaped) and a tensor
key argument contributes `str(tensor.dtype)` (`"torch.float16"`).

What makes installed bundles visible to FlyDSL at run time is `runtime.adapters.flydsl`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..core import codec, fsutil, options
from ..core.artifact import KERNEL_NAME, KERNEL_NAME_MAX, Artifact, read_capped
from ..core.config import Config
from ..core.device import DeviceIdentity
from ..core.errors import ArtifactError, OutputError
from ..core.key import dtype_name

VERSION = 1
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
TORCH_DTYPES = {"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                "float8_e5m2fnuz", "int8", "uint8", "int16", "int32", "int64", "bool", "complex64"}


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def identity(art: Artifact) -> dict:
    key = {k: (f"torch.{v}" if isinstance(v, str) and v in TORCH_DTYPES else v) for k, v in art.key.items()}
    dev = art.device
    return {"name": art.kernel, "key": key,
            "device": {"name": dev.name, "arch": dev.arch, "compute_units": dev.units}}


def to_flydsl(art: Artifact) -> tuple[str, bytes]:
    """(file name, bytes) of `art` in FlyDSL's format; an ArtifactError when it cannot be expressed."""
    f = art.filename
    if art.device.backend != "hip":
        raise ArtifactError(f"is a {art.device.backend} artifact: FlyDSL runs on ROCm (hip) devices only",
                            file=f, field="device.backend")
    if not NAME.fullmatch(art.kernel):
        raise ArtifactError("is not a FlyDSL artifact name (1-64 letters, digits, '.', '_', '-')", file=f,
                            field="kernel")
    c = art.config
    for opt, default in (("num_stages", 3), ("num_ctas", 1), ("maxnreg", None)):
        if getattr(c, opt) != default:
            raise ArtifactError(f"is {getattr(c, opt)!r}: FlyDSL configs carry no {opt}", file=f,
                                field=f"config.{opt}")
    ident = identity(art)
    body = {**c.kwargs, "num_warps": c.num_warps}
    digest = hashlib.sha256(_canonical(ident).encode()).hexdigest()
    payload = {"version": VERSION, "identity": ident, "config": body}
    return f"{art.kernel}-{digest}.json", (json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def from_flydsl(path: str | Path, *, name: str | None = None) -> Artifact:
    """A flytune artifact from one FlyDSL offline-config file (its identity hash is checked)."""
    path = Path(path)
    doc = codec.loads(read_capped(path, ArtifactError), file=path, error=ArtifactError)
    f = codec.Fields(path, ArtifactError)
    f.table(doc, "", ("version", "identity", "config"))
    if doc["version"] != VERSION or isinstance(doc["version"], bool):
        f.fail("version", f"is unknown FlyDSL artifact version {doc['version']!r} (this flytune reads {VERSION})")
    ident = f.table(doc["identity"], "identity", ("name", "key", "device"))
    digest = hashlib.sha256(_canonical(ident).encode()).hexdigest()
    if path.name != f"{ident['name']}-{digest}.json":
        f.fail("<file name>", f"does not match the identity's hash (expected {ident['name']}-{digest[:12]}...json)")
    kernel = name or str(ident["name"]).replace("-", "_")
    if not KERNEL_NAME.fullmatch(kernel) or len(kernel) > KERNEL_NAME_MAX:
        f.fail("identity.name", f"{ident['name']!r} is no dotted Python name of at most {KERNEL_NAME_MAX} "
                                f"characters: pass a name to import it under")
    key = {}
    for axis, value in f.mapping(ident["key"], "identity.key").items():
        if isinstance(value, list):
            f.fail(f"identity.key.{axis}", "is a shape: flytune keys hold scalars (declare the dimensions as axes)")
        value = f.scalar(value, f"identity.key.{axis}")
        key[axis] = dtype_name(value) if isinstance(value, str) else value
    dev = f.table(ident["device"], "identity.device", ("name", "arch", "compute_units"))
    device = DeviceIdentity.from_json({"backend": "hip", "arch": dev["arch"], "name": dev["name"],
                                       "units": dev["compute_units"]}, f, "identity.device")
    body = dict(f.mapping(doc["config"], "config"))  # `waves_per_eu` stays among the kwargs, as Triton takes it
    num_warps = body.pop("num_warps", 4)
    config = Config.from_json({"kwargs": body, "num_warps": num_warps}, f)
    for option, rule in options.config_problems(config.kwargs, config.num_warps, device.backend):  # as verify
        f.fail(f"config.{option}", rule)
    return Artifact(kernel, key, device, config, {"ranking": "imported", "source": f"flydsl:{path.name}"[:1024]})


def export(artifacts, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Write every expressible artifact into `out_dir`, all or none; returns (written files, reasons for the
    skipped ones). `out_dir` is made where need be, and refused (an OutputError) before anything is
    written where it cannot be a directory (a file); a FlyDSL file of the same name there (the identity's
    earlier winner) is replaced, and put back as it was when the write fails."""
    out = fsutil.output_directory(out_dir)
    skipped, made, clashing = [], {}, set()
    for art in artifacts:
        try:
            name, data = to_flydsl(art)
        except ArtifactError as e:
            skipped.append(str(e))
            continue
        first = made.setdefault(name, (art, data))
        if first[1] != data:  # FlyDSL keys dtypes as "torch.float16": "float16" and "torch.float16" meet here
            clashing.add(name)
            skipped.append(str(ArtifactError(f"is FlyDSL's {name}, as {first[0].filename} is, with another config: "
                                             f"neither is written", file=art.filename)))
    files = [(out / name, data) for name, (_, data) in made.items() if name not in clashing]
    previous = {path: fsutil.read_regular(path, OutputError, codec.MAX_DOCUMENT_BYTES)  # a non-file there: refused
                for path, _ in files if os.path.lexists(path)}
    fsutil.write_all(files, previous)  # all or none
    return [path for path, _ in files], skipped
