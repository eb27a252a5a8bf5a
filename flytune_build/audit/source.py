"""What `flytune verify`, `inspect` and `diff` read: a wheel, an sdist, a directory or an installed
distribution, opened without a GPU and without importing the package (unless `--deep`).

Bundles are read by core.bundle and judged by core.verification, the rules the build applies, so a
defect reads the same here as in the build; toolchain drift, rankings mixed on one device and a
bundle with no artifact are warnings unless `--strict` (a project's drift, which its build rejects, is
a violation). A wheel is read as installers and the runtime read it (dist.wheelfile); every file is
read through core.fsutil (regular files only, capped) and every directory walked by core.fsutil.find
(contained, loop-free, bounded). Anything that holds no bundle is a violation, never "ok". A Source is data: its
text is cli.render's (which escapes control characters in names), its JSON `to_json`.
"""
from __future__ import annotations

import csv
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core import artifactdir, bundle, fsutil, serving, verification
from ..core import installed as installed_bundles
from ..core.artifact import Artifact
from ..core.errors import (
    ArtifactError,
    BundleError,
    FlytuneError,
    InputError,
    ProjectError,
)
from ..core.target import Target
from ..dist import wheelfile
from ..pipeline.assemble import EDITABLE_ROOT

NO_BUNDLE = "holds no flytune bundle: the runtime would serve nothing from it"
MAX_SDIST_BYTES = 1 << 30     # unpacked, all members together
MAX_SDIST_MEMBERS = 100_000


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
    mixed: list[FlytuneError] = field(default_factory=list)  # rankings mixed on one device: warnings unless --strict
    modules: set[str] = field(default_factory=set)  # packages the project or distribution itself declares
    execution: list[dict] | None = None  # verify --execute: per artifact, executed (ok) or skipped and why
    reads: tuple[str, ...] = ()  # what it was read from (the file, the directory; a project's pyproject.toml and
    # the folders its sources walk): what a command writing beside it keeps apart from (fsutil.apart)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        kernels = sorted({a.kernel for a in self.artifacts})
        return {"path": self.path, "kind": self.kind, "ok": self.ok, "kernels": len(kernels),
                "artifacts": len(self.artifacts), "errors": [e.to_json() for e in self.errors],
                "warnings": list(self.warnings), **({} if self.execution is None else {"execution": self.execution})}


def open_source(path: str) -> Source:
    """The source `path` names, read and checked; what is wrong with it is in its `errors`, never raised:
    a path the system cannot look at (too long, a loop of links, no permission) is that source's error,
    and the other sources of one command are still read."""
    try:
        src = _open(path)
    except OSError as e:
        src = Source(path, "unknown")
        src.errors.append(InputError(f"cannot be read: {e.strerror or e}", file=e.filename or path))
    if not src.reads and src.kind != "installed" and os.path.lexists(path):
        src.reads = (path,)
    return src


def _open(path: str) -> Source:
    p = Path(path)
    if p.is_file() and p.suffix == ".whl":
        return _wheel(p)
    if p.is_file() and (p.name.endswith(".tar.gz") or p.name.endswith(".tgz")):
        return _sdist(p)
    if p.is_dir():
        if os.path.lexists(p / "pyproject.toml"):   # a project, whatever it is: a build reads (or refuses) it
            return _project(p, str(p))
        if p.name == bundle.DIRNAME and (p / bundle.MANIFEST).is_file():
            src = Source(path, "bundle directory")
            src.errors.append(InputError(f"is a built bundle ({bundle.DIRNAME}/), not something to verify on its "
                                         f"own: verify the wheel (dist/*.whl), the installed distribution or "
                                         f"the artifact directory it was built from", file=path))
            return src
        return _directory(p)
    if not p.exists() and "/" not in path and "\\" not in path:
        return _installed(path)
    src = Source(path, "unknown")
    if not p.exists():
        why = "does not exist: pass a wheel, an sdist, a directory or an installed distribution's name"
    elif p.is_file() and p.suffix == ".json":
        why = "is one artifact file: pass the directory that holds it (or the project, the wheel)"
    else:
        why = "is not a wheel, an sdist, a directory or an installed distribution"
    src.errors.append(InputError(why, file=path))
    return src


# -- wheels ---------------------------------------------------------------------------------------------
def _wheel(path: Path) -> Source:
    src = Source(str(path), "wheel")
    try:
        whl = wheelfile.open_wheel(path)
    except BundleError as e:
        src.errors.append(e)
        return src
    with whl.zf:
        whl.check_identity()
        whl.check_record()
        eps = whl.entry_points(bundle.ENTRY_POINT_GROUP)
        src.modules = wheelfile.modules(whl.members)
        _wheel_bundles(src, whl, eps)
    src.errors[:0] = whl.errors
    return src


def _wheel_bundles(src: Source, whl: wheelfile.Wheel, eps: list) -> None:
    """Each bundle where an entry point sends the runtime, and no bundle the runtime would not find."""
    ep_file = f"{whl.path}!{whl.dist_info}/entry_points.txt"
    reached = set()
    for ep in eps:
        parts = serving.bundle_parts(ep.value)  # where core.installed.locate looks
        if parts is None:
            src.errors.append(_not_a_module(ep, ep_file))
            continue
        base = "/".join(parts) + "/"
        name = base + bundle.MANIFEST
        if name not in whl.members:
            src.errors.append(BundleError(f"names {ep.value!r}, but the wheel has no {name}: the runtime will not "
                                          f"find the bundle", file=ep_file,
                                          field=f"{bundle.ENTRY_POINT_GROUP}.{ep.name}"))
            continue
        if name in reached:
            continue
        reached.add(name)
        try:
            data = whl.read(name, bundle.MAX_MANIFEST_BYTES)
        except BundleError as e:
            src.errors.append(e)
            continue
        manifest = _bundle(src, f"{whl.path}!{base}", data, lambda n, b=base: whl.read(b + n, bundle.MAX_SHARD_BYTES))
        _check_entry_value(src, ep, manifest, ep_file)
        _check_owner(src, ep, manifest, _wheel_owns(whl.members, ep.value, manifest), f"{whl.path}!{name}")
    for name in sorted(n for n in whl.members if _is_manifest(n) and n not in reached):
        src.errors.append(BundleError(f"no entry point in group {bundle.ENTRY_POINT_GROUP} names this bundle: the "
                                      f"runtime will not find it", file=f"{whl.path}!{name}"))
    if not eps and not any(_is_manifest(n) for n in whl.members):
        src.errors.append(BundleError(NO_BUNDLE, file=whl.path))


def _check_entry_value(src: Source, ep, manifest: bundle.Manifest | None, file: str) -> None:
    if manifest is not None and ep.value not in _entry_values(manifest, ep.name):
        src.errors.append(BundleError(f"is {ep.value!r}; it must be exactly {manifest.package}.{bundle.DIRNAME} "
                                      f"(the manifest's package)", file=file,
                                      field=f"{bundle.ENTRY_POINT_GROUP}.{ep.name}"))


def _entry_values(manifest: bundle.Manifest, name: str) -> tuple[str, ...]:
    """The values an entry point for this bundle may have: the package's, or an editable wheel's."""
    return serving.bundle_value(manifest.package), serving.editable_value(name)


def _not_a_module(ep, file: str) -> BundleError:
    return BundleError(f"is {ep.value!r}, not a dotted module name: the runtime follows no path, it looks for "
                       f"<package>/{bundle.DIRNAME}/ among the distribution's own files", file=file,
                       field=f"{bundle.ENTRY_POINT_GROUP}.{ep.name}")


def _check_owner(src: Source, ep, manifest: bundle.Manifest | None, owned: bool, file: str) -> None:
    """A bundle must sit in a package the distribution itself owns (never `numpy/`, never another
    distribution's `fla/ops/`; `owned`: the runtime's rule, core.serving.owns); artifacts it holds for
    kernels outside that package are a config pack, said as a warning."""
    if manifest is None:
        return
    if not owned:
        where = ("an editable install whose source tree does not hold it" if serving.is_editable_value(ep.value)
                 else f"which this {src.kind} does not otherwise contain, or whose __init__.py another "
                      f"distribution installs")
        src.errors.append(BundleError(f"places a bundle under package {manifest.package!r}, {where}: the runtime "
                                      f"serves no kernel from it as their owner (a bundle goes only into the "
                                      f"distribution's own package)", file=file, field="package"))
    foreign = sorted(k for k in manifest.kernels if not serving.under(k, manifest.package))
    if foreign:
        src.warnings.append(f"{file}: holds artifacts for {len(foreign)} kernel(s) outside package "
                            f"{manifest.package} ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): a "
                            f"config pack, served only where the kernel's owner accepts it ([tool.flytune] packs) or "
                            f"the user sets FLYTUNE_PACKS, and only for keys the owner lacks")


def _wheel_owns(members, value: str, manifest: bundle.Manifest | None) -> bool:
    """Whether a wheel owns its bundle's package: it installs it (core.serving.owns, the wheel's members
    being all that is beside it); an editable wheel's bundle, where the wheel is an editable one (a
    top-level `.pth` puts the source tree on sys.path: whether that tree holds the package is known only
    once installed, and the runtime checks it there)."""
    if manifest is None:
        return True
    members = set(members)
    if serving.is_editable_value(value):
        return serving.installs(members, manifest.package) or any("/" not in m and m.endswith(".pth") for m in members)
    return serving.owns(members, manifest.package, members.__contains__)


def _is_manifest(name: str) -> bool:
    parts = name.split("/")
    return parts[-1] == bundle.MANIFEST and (parts[-2:-1] == [bundle.DIRNAME] or
                                             (len(parts) == 3 and parts[0] == EDITABLE_ROOT))


def _bundle(src: Source, label: str, manifest_bytes: bytes, read) -> bundle.Manifest | None:
    got = bundle.read(label, manifest_bytes, read)
    src.errors += got.errors
    src.sizes.update(got.sizes)
    src.artifacts += got.artifacts
    if got.manifest is None:
        return None
    src.manifest, src.targets, src.package = got.manifest, got.manifest.targets, got.manifest.package
    declared = verification.Declaration.of_manifest(got.manifest, label + bundle.MANIFEST)
    found = verification.check(got.artifacts, got.where, declared, with_toolchain=False)
    src.errors += found.errors
    src.warnings += found.warnings
    src.drift += verification.toolchain(got.artifacts, got.where, declared).errors
    src.mixed += verification.rankings(got.artifacts, got.where).errors
    _installed_drift(src, declared)
    return got.manifest


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
SDIST_ERRORS = (tarfile.TarError, ValueError, *wheelfile.DECOMPRESS_ERRORS)


def _sdist(path: Path) -> Source:
    from ..dist import archive

    src = Source(str(path), "sdist")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _check_sdist_size(path)
            archive.extract(path, tmp)
        except FlytuneError as e:
            src.errors.append(e)
            return src
        except SDIST_ERRORS as e:
            src.errors.append(BundleError(f"is not a readable sdist: {type(e).__name__}: {e}", file=path))
            return src
        tops = [p for p in Path(tmp).iterdir() if (p / "pyproject.toml").is_file()]
        if len(tops) != 1:
            why = "has no top-level directory with pyproject.toml" if not tops else \
                f"has {len(tops)} top-level directories with pyproject.toml ({', '.join(sorted(p.name for p in tops)[:3])}" \
                f"{', ...' if len(tops) > 3 else ''}): an sdist holds one project"
            src.errors.append(BundleError(why, file=path))
            return src
        src = _project(tops[0], str(path))
        src.kind = "sdist"
        for e in src.errors:  # name the member of the sdist, not the extraction directory, gone on return
            if e.file and Path(e.file).is_absolute() and Path(e.file).is_relative_to(tmp):
                e.relocate(f"{path}!{Path(e.file).relative_to(tmp).as_posix()}")
        return src


def _check_sdist_size(path: Path) -> None:
    """Refuse, before unpacking anything, an sdist that would unpack past the caps (a tar bomb)."""
    from ..dist import archive

    total = count = 0
    with archive.open_tar(path) as tf:
        for m in tf:
            count += 1
            total += max(m.size, 0) if m.isreg() else 0
            if count > MAX_SDIST_MEMBERS or total > MAX_SDIST_BYTES:
                raise BundleError(f"would unpack to more than {MAX_SDIST_MEMBERS} members or {MAX_SDIST_BYTES} "
                                  f"bytes: refused", file=path)


def _project(root: Path, label: str) -> Source:
    from .. import pipeline as build_mod
    from ..pipeline import collect, verify

    src = Source(label, "project")
    try:
        proj = build_mod.load(root)   # a table misnamed ([tool.flytun]) is named, as the build names it
    except FlytuneError as e:
        src.errors.append(e)
        return src
    if proj is None:
        src.errors.append(ProjectError("has no [tool.flytune] table: a build makes no bundle of it",
                                       file=root / "pyproject.toml"))
        return src
    src.reads = (str(root / "pyproject.toml"), *(str(fsutil.walk_root(root, s)) for s in proj.sources))
    state = verify.verify(collect.collect(build_mod.BuildState(proj)))
    src.artifacts, src.errors, src.targets = state.artifacts, list(state.rejected), proj.targets
    src.package, src.modules = proj.package, {proj.package}
    src.mixed = verify.mixed(state)  # the build's warnings; here, as for any source, violations under --strict
    said = {str(e) for e in src.mixed}
    src.warnings += [w for w in state.warnings if w not in said]
    src.warnings += [f"excluded {p} (tuned on {d})" for p, d in state.excluded]
    _installed_drift(src, verification.Declaration.of_project(proj))
    return src


def _directory(root: Path) -> Source:
    src = Source(str(root), "directory")
    origin: dict[int, str] = {}
    found = artifactdir.read_all(root, recursive=True)  # contained, bounded, capped
    src.errors += found.problems
    for path, data in found.files:
        try:
            art = Artifact.from_bytes(data, file=path, canonical=True)
        except FlytuneError as e:
            e.relocate(path)
            src.errors.append(e)
            continue
        src.artifacts.append(art)
        origin[id(art)] = str(path)
        src.sizes[path.relative_to(root).as_posix()] = len(data)
    found = verification.check(src.artifacts, lambda a: origin[id(a)])
    src.errors += found.errors
    src.warnings += found.warnings
    src.mixed += verification.rankings(src.artifacts, lambda a: origin[id(a)]).errors
    if not src.artifacts and not src.errors:
        src.errors.append(ArtifactError("holds no artifact file (*.json): nothing to verify", file=root))
    return src


def _installed(name: str) -> Source:
    from importlib.metadata import PackageNotFoundError, distribution

    src = Source(name, "installed")
    try:
        dist = distribution(name)
    except (PackageNotFoundError, ValueError):
        src.errors.append(InputError("does not exist: no file, directory or installed distribution of that name",
                                     file=name))
        return src
    try:
        for name_ in ("METADATA", "entry_points.txt", "RECORD"):  # regular files, capped: a FIFO is refused, not read
            installed_bundles.metadata_text(dist, name_)
        eps = [ep for ep in dist.entry_points if ep.group == bundle.ENTRY_POINT_GROUP]
        files = list(dist.files or [])
    except FlytuneError as e:
        src.errors.append(e)
        return src
    except (ValueError, TypeError, OSError, csv.Error) as e:  # entry_points.txt or RECORD the runtime cannot read
        src.errors.append(BundleError(f"has metadata importlib.metadata cannot read: {type(e).__name__}: {e}",
                                      file=name))
        return src
    src.modules = wheelfile.modules(str(f) for f in files)
    if not eps:
        src.errors.append(BundleError(NO_BUNDLE, file=name))
    record = {str(f): f for f in files}
    for ep in eps:
        _installed_bundle(src, name, ep, record)
    _check_foreign_files(src, name, record)
    return src


def _check_foreign_files(src: Source, name: str, record: dict) -> None:
    """A distribution whose RECORD lists files of a package another installed distribution owns (the
    runtime's owner: core.installed): installing it overwrites, and uninstalling it removes, the
    owner's files."""
    owners = {s.package: s.dist for s in installed_bundles.bundles() if s.package and s.dist}
    for path in sorted(record):
        parts = path.replace("\\", "/").split("/")
        for depth in range(len(parts) - 1, 0, -1):
            owner = owners.get(".".join(parts[:depth]))
            if owner is not None and serving.normalize(owner) != serving.normalize(name):
                src.errors.append(BundleError(f"lists {path} among its own files, a file of package "
                                              f"{'.'.join(parts[:depth])}, which distribution {owner} owns: "
                                              f"installing {name} overwrites it, uninstalling removes it",
                                              file=name, field="RECORD"))
                return


def _installed_bundle(src: Source, name: str, ep, record: dict) -> None:
    parts = serving.bundle_parts(ep.value)
    if parts is None:
        src.errors.append(_not_a_module(ep, name))
        return
    loc = installed_bundles.locate(ep)
    if loc is None:
        src.errors.append(BundleError(f"entry point {ep.name} = {ep.value} names no readable bundle among the "
                                      f"distribution's own files", file=name))
        return
    _check_entry_value(src, ep, loc.manifest, name)
    rel = "/".join(parts) + "/"
    if not loc.recorded and loc.package is not None:  # laid out by hand: no owner where an installed one is
        loc = next((s for s in installed_bundles.bundles() if s.dist == loc.dist and s.root == loc.root), loc)
    _check_owner(src, ep, loc.manifest, loc.package is not None, str(loc.root / bundle.MANIFEST))
    blobs: dict[str, bytes | None] = {}
    read_member = bundle.member_reader(loc.root)  # capped, regular files only

    def read(fname):
        if fname not in blobs:
            blobs[fname] = read_member(fname)
        return blobs[fname]

    try:
        names = [p.name for p in artifactdir.listing(loc.root, error=BundleError)]
    except FlytuneError as e:
        src.errors.append(e)
        return
    for fname in names:
        f = record.get(rel + fname)
        if f is None or f.hash is None:
            continue
        try:
            blob = read(fname)
        except FlytuneError as e:
            src.errors.append(e)
            continue
        if blob is None or wheelfile.digest(f.hash.mode, blob) != f.hash.value.rstrip("="):
            src.errors.append(BundleError(f"does not match its RECORD line ({f.hash.mode}: altered after install, or "
                                          f"a hash the wheel spec does not allow)", file=str(loc.root / fname),
                                          field="RECORD"))
    try:
        manifest_bytes = read(bundle.MANIFEST) or b""
    except FlytuneError as e:
        src.errors.append(e)
        return
    _bundle(src, str(loc.root) + "/", manifest_bytes, read)


# -- verify / inspect / diff ---------------------------------------------------------------------------------
def verify(path: str, *, strict: bool = False, deep: bool = False, execute: bool = False) -> Source:
    src = open_source(path)
    for finding in src.drift + src.mixed:
        (src.errors.append(finding) if strict else src.warnings.append(str(finding)))
    if src.ok and not src.artifacts:  # a bundle that serves nothing is no pre-tuned package: never a silent ok
        empty = BundleError(f"holds a bundle with no artifact: it serves nothing{' (strict)' if strict else ''}; "
                            f"tune and build again, or drop [tool.flytune]", file=src.path)
        (src.errors.append(empty) if strict else src.warnings.append(str(empty)))
    if (deep or execute) and src.ok:
        from . import execution as deep_mod

        deep_mod.check(src, execute=execute)
    return src
