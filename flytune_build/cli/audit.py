"""What `flytune verify`, `inspect` and `diff` read: a wheel, an sdist, a directory or an installed
distribution, opened without a GPU and without importing the package (unless `--deep`).

Bundles are read by core.bundle and judged by core.verification, the rules the build applies, so a
defect reads the same here as in the build; toolchain drift is a warning unless `--strict`.
"""
from __future__ import annotations

import csv
import io
import math
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core import bundle, codec, table, verification
from ..core.artifact import Artifact
from ..core.errors import BundleError, FlytuneError
from ..core.target import Target
from ..pipeline.wheel import record_hash


@dataclass
class Source:
    path: str
    kind: str                                   # wheel | sdist | project | directory | installed
    manifest: bundle.Manifest | None = None
    artifacts: list[Artifact] = field(default_factory=list)
    errors: list[FlytuneError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)   # shard or file -> bytes
    targets: tuple[Target, ...] = ()
    package: str | None = None
    drift: list[FlytuneError] = field(default_factory=list)  # toolchain drift: warnings unless --strict

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        kernels = sorted({a.kernel for a in self.artifacts})
        return {"path": self.path, "kind": self.kind, "ok": self.ok, "kernels": len(kernels),
                "artifacts": len(self.artifacts), "errors": [e.to_json() for e in self.errors],
                "warnings": list(self.warnings)}

    def render(self) -> str:
        head = "ok" if self.ok else f"{len(self.errors)} violation(s)"
        lines = [f"{self.path} ({self.kind}): {head}; {len(self.artifacts)} artifact(s), "
                 f"{len({a.kernel for a in self.artifacts})} kernel(s)"]
        lines += [f"  error: {e}" for e in self.errors]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def open_source(path: str) -> Source:
    p = Path(path)
    if p.is_file() and p.suffix == ".whl":
        return _wheel(p)
    if p.is_file() and (p.name.endswith(".tar.gz") or p.name.endswith(".tgz")):
        return _sdist(p)
    if p.is_dir():
        return _project(p, str(p)) if (p / "pyproject.toml").is_file() else _directory(p)
    if not p.exists() and "/" not in path and "\\" not in path:
        return _installed(path)
    src = Source(path, "unknown")
    src.errors.append(FlytuneError("is not a wheel, an sdist, a directory or an installed distribution",
                                   file=path))
    return src


# -- wheels ---------------------------------------------------------------------------------------------
def _wheel(path: Path) -> Source:
    src = Source(str(path), "wheel")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        src.errors.append(BundleError(f"is not a readable zip archive: {e}", file=path))
        return src
    with zf:
        members = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        records = [n for n in members if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            src.errors.append(BundleError("must hold exactly one *.dist-info/RECORD", file=path, field="RECORD"))
            return src
        record_name = records[0]
        data = {}
        for name in members:
            try:
                data[name] = zf.read(name)
            except (zipfile.BadZipFile, OSError, EOFError) as e:  # a CRC mismatch: bytes changed in place
                src.errors.append(BundleError(f"cannot be read from the archive: {e}", file=f"{path}!{name}"))
    _check_record(src, path, data, record_name)
    prefix = record_name.split("/")[0]
    eps = data.get(f"{prefix}/entry_points.txt", b"").decode("utf-8", "replace")
    manifests = sorted(n for n in data if n.endswith(f"/{bundle.DIRNAME}/{bundle.MANIFEST}"))
    for m in manifests:
        base = m[: -len(bundle.MANIFEST)]
        _bundle(src, f"{path}!{base}", data[m], lambda name: data.get(base + name))
        if src.manifest is not None and f"{src.manifest.package}.{bundle.DIRNAME}" not in eps:
            src.errors.append(BundleError(f"has no entry point in group {bundle.ENTRY_POINT_GROUP} naming "
                                          f"{src.manifest.package}.{bundle.DIRNAME}: the runtime will not find "
                                          f"the bundle", file=f"{path}!{prefix}/entry_points.txt"))
    if not manifests:
        src.warnings.append("holds no flytune bundle")
    return src


def _check_record(src: Source, path: Path, data: dict[str, bytes], record_name: str) -> None:
    text = data.get(record_name, b"").decode("utf-8", "replace")
    listed = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            src.errors.append(BundleError(f"has a malformed line {','.join(row)!r}", file=f"{path}!{record_name}"))
            continue
        listed[row[0]] = (row[1], row[2])
    for name, blob in sorted(data.items()):
        if name == record_name:
            continue
        if name not in listed:
            src.errors.append(BundleError("is in the wheel but missing from RECORD", file=f"{path}!{name}",
                                          field="RECORD"))
            continue
        digest, size = listed[name]
        if digest != record_hash(blob) or size != str(len(blob)):
            src.errors.append(BundleError("does not match its RECORD line (sha256 or size differs: the member "
                                          "was altered)", file=f"{path}!{name}", field="RECORD"))
    for name, (digest, _) in sorted(listed.items()):
        if name not in data and name != record_name:
            src.errors.append(BundleError("is listed in RECORD but absent from the wheel", file=f"{path}!{name}",
                                          field="RECORD"))


def _bundle(src: Source, label: str, manifest_bytes: bytes, read) -> None:
    got = bundle.read(label, manifest_bytes, read)
    src.errors += got.errors
    src.sizes.update(got.sizes)
    src.artifacts += got.artifacts
    if got.manifest is None:
        return
    src.manifest, src.targets, src.package = got.manifest, got.manifest.targets, got.manifest.package
    declared = verification.Declaration.of_manifest(got.manifest, label + bundle.MANIFEST)
    found = verification.check(got.artifacts, got.where, declared, with_toolchain=False)
    src.errors += found.errors
    src.warnings += found.warnings
    src.drift += verification.toolchain(got.artifacts, got.where, declared).errors
    _installed_drift(src, declared)


def _installed_drift(src: Source, declared: verification.Declaration) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("triton")
    except PackageNotFoundError:
        return
    drift = verification.installed_toolchain(installed, declared)
    if drift is not None:
        src.drift.append(drift)


# -- sdists, projects, directories, installed distributions -----------------------------------------------
def _sdist(path: Path) -> Source:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(path, "r:gz") as tf:
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as e:
            src = Source(str(path), "sdist")
            src.errors.append(BundleError(f"is not a readable sdist: {e}", file=path))
            return src
        tops = [p for p in Path(tmp).iterdir() if (p / "pyproject.toml").is_file()]
        if len(tops) != 1:
            src = Source(str(path), "sdist")
            src.errors.append(BundleError("has no top-level directory with pyproject.toml", file=path))
            return src
        src = _project(tops[0], str(path))
        src.kind = "sdist"
        return src


def _project(root: Path, label: str) -> Source:
    from .. import pipeline as build_mod
    from ..core import project
    from ..pipeline import collect, verify

    src = Source(label, "project")
    try:
        proj = project.load(root)
    except FlytuneError as e:
        src.errors.append(e)
        return src
    if proj is None:
        src.warnings.append("pyproject.toml has no [tool.flytune] table")
        return src
    state = verify.verify(collect.collect(build_mod.BuildState(proj)))
    src.artifacts, src.errors, src.targets = state.artifacts, list(state.rejected), proj.targets
    src.package = proj.package
    src.warnings += state.warnings + [f"excluded {p} (tuned on {d})" for p, d in state.excluded]
    _installed_drift(src, verification.Declaration.of_project(proj))
    return src


def _directory(root: Path) -> Source:
    src = Source(str(root), "directory")
    origin: dict[int, str] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            art = Artifact.load(path, canonical=True)
        except FlytuneError as e:
            src.errors.append(e)
            continue
        src.artifacts.append(art)
        origin[id(art)] = str(path)
        src.sizes[str(path.relative_to(root))] = path.stat().st_size
    found = verification.check(src.artifacts, lambda a: origin[id(a)])
    src.errors += found.errors
    src.warnings += found.warnings
    return src


def _installed(name: str) -> Source:
    from importlib.metadata import PackageNotFoundError, distribution

    src = Source(name, "installed")
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        src.errors.append(FlytuneError("is not a file, a directory or an installed distribution", file=name))
        return src
    eps = [ep for ep in dist.entry_points if ep.group == bundle.ENTRY_POINT_GROUP]
    if not eps:
        src.warnings.append("registers no flytune bundle")
        return src
    record = {str(f): f for f in (dist.files or [])}
    for ep in eps:
        from ..runtime.offline import locate

        loc = locate(ep)
        if loc is None:
            src.errors.append(BundleError(f"entry point {ep.name} = {ep.value} names no readable bundle", file=name))
            continue
        rel = ep.value.replace(".", "/") + "/"

        def read(fname, root=loc.root):
            p = root / fname
            return p.read_bytes() if p.is_file() else None

        for fname in sorted(p.name for p in loc.root.iterdir() if p.is_file() and p.suffix == ".json"):
            f = record.get(rel + fname)
            if f is not None and f.hash is not None:
                blob = read(fname)
                if record_hash(blob) != f"{f.hash.mode}={f.hash.value}":
                    src.errors.append(BundleError("does not match its RECORD line (altered after install)",
                                                  file=str(loc.root / fname), field="RECORD"))
        _bundle(src, str(loc.root) + "/", read(bundle.MANIFEST) or b"", read)
    return src


# -- verify / inspect / diff ---------------------------------------------------------------------------------
def verify(path: str, *, strict: bool = False, deep: bool = False, execute: bool = False) -> Source:
    src = open_source(path)
    for drift in src.drift:
        (src.errors.append(drift) if strict else src.warnings.append(str(drift)))
    if (deep or execute) and src.ok:
        from . import deep as deep_mod

        deep_mod.check(src, execute=execute)
    return src


def inspect(src: Source) -> dict:
    targets = list(src.targets) or sorted({Target(a.device.arch) for a in src.artifacts}, key=lambda t: t.label())
    kernels = sorted({a.kernel for a in src.artifacts})
    matrix = {k: {t.label(): sum(1 for a in src.artifacts if a.kernel == k and t.covers(a.device))
                  for t in targets} for k in kernels}
    axes = {k: sorted({ax for a in src.artifacts if a.kernel == k for ax in a.key_axes()}) for k in kernels}
    tuned = sorted({(a.provenance or {}).get("triton") for a in src.artifacts} - {None})
    return {"path": src.path, "kind": src.kind, "ok": src.ok, "package": src.manifest.package if src.manifest else None,
            "targets": [{"label": t.label(), "accept": list(t.accept)} for t in targets],
            "coverage": matrix, "key_axes": axes,
            "toolchain": {"declared": src.manifest.triton if src.manifest else None, "tuned_with_triton": tuned},
            "artifacts": len(src.artifacts), "bytes": sum(src.sizes.values()), "sizes": dict(sorted(src.sizes.items())),
            "errors": [e.to_json() for e in src.errors]}


def render_inspect(info: dict) -> str:
    labels = [t["label"] for t in info["targets"]]
    rows = [["kernel", *labels, "key axes"]]
    rows += [[k, *(row[lab] for lab in labels), ", ".join(info["key_axes"][k])] for k, row in info["coverage"].items()]
    lines = [f"{info['path']} ({info['kind']}{', package ' + info['package'] if info['package'] else ''})",
             table.render(rows, align="<" + ">" * len(labels), indent="  ")]
    lines.append("  accepted match levels: " + "; ".join(f"{t['label']}: {', '.join(t['accept'])}"
                                                       for t in info["targets"]))
    tc = info["toolchain"]
    lines.append(f"  toolchain: triton {tc['declared'] or '(any)'}; tuned with {', '.join(tc['tuned_with_triton']) or '?'}")
    lines.append(f"  {info['artifacts']} artifact(s), {info['bytes']} bytes")
    lines += [f"  error: {e['message']}" for e in info["errors"]]
    return "\n".join(lines)


def diff(old: Source, new: Source) -> dict:
    a = {x.address: x for x in old.artifacts}
    b = {x.address: x for x in new.artifacts}

    def ident(x: Artifact) -> dict:
        return {"kernel": x.kernel, "key": dict(x.key), "device": x.device.spec()}

    changed = []
    for addr in sorted(a.keys() & b.keys()):
        if a[addr].config != b[addr].config:
            changed.append({**ident(b[addr]), "old": str(a[addr].config), "new": str(b[addr].config),
                            "margin": _margin(b[addr], a[addr].config)})
    return {"added": [ident(b[x]) for x in sorted(b.keys() - a.keys())],
            "removed": [ident(a[x]) for x in sorted(a.keys() - b.keys())],
            "changed": changed, "unchanged": sum(1 for x in a.keys() & b.keys() if a[x].config == b[x].config),
            "errors": [e.to_json() for e in old.errors + new.errors]}


def _margin(new: Artifact, old_config) -> float | None:
    """How much slower the old winner was, in the new tuning run's own measurements."""
    times = {}
    for c in (new.provenance or {}).get("candidates", []):
        if c.get("time_ms") is not None:
            times[codec.canonical(c["config"])] = c["time_ms"]
    t_new = times.get(codec.canonical(new.config.to_json()))
    t_old = times.get(codec.canonical(old_config.to_json()))
    if t_new and t_old and math.isfinite(t_new):
        return t_old / t_new - 1
    return None


def render_diff(d: dict) -> str:
    def key(x):
        return f"{x['kernel']} {x['key']} on {x['device']}"

    lines = [f"+ {key(x)}" for x in d["added"]] + [f"- {key(x)}" for x in d["removed"]]
    for x in d["changed"]:
        m = "" if x["margin"] is None else f" (old winner {x['margin'] * 100:+.1f}% slower in the new run)"
        lines.append(f"~ {key(x)}: {x['old']} -> {x['new']}{m}")
    lines.append(f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed, "
                 f"{d['unchanged']} unchanged")
    lines += [f"error: {e['message']}" for e in d["errors"]]
    return "\n".join(lines)
