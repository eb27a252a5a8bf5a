"""Installed bundles: the one reader of what the runtime, warm-up, Inductor serving and `flytune inspect
--installed` may serve.

Discovery is by entry points in group `flytune.bundles` (nothing is imported to find a bundle): an
entry point's value is a dotted module name inside its distribution's own files (RECORD, where there
is one). Ownership (core.serving), one rule for the runtime, warm-up and `inspect --installed`
(`ownership`): a bundle owns the kernels under its package when its distribution installs that package
itself (another listing its `__init__.py` too is ambiguity: `serving.contest`), or, for an editable
install, when the install's source tree holds it; imported from elsewhere, only from the distribution's
own source tree (`source_tree`). FLYTUNE_ARTIFACT_DIR directories come first (the user's own artifacts).

Every function here reads; none keeps state between calls (but `_device`, a bounded cache of parsed
device documents) and none warns by itself: what is ignored
and why goes to the caller's `warn(cause, message)`, so the runtime warns once per cause while an
audit lists it.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from . import artifactdir, bundle, fsutil, serving, settings
from .artifact import Artifact
from .codec import Fields
from .device import DeviceIdentity
from .errors import ArtifactError, BundleError, FlytuneError
from .target import DEFAULT_ACCEPT

Warn = Callable[[tuple, str], Any]
MAX_METADATA_BYTES = 64 << 20  # a distribution's RECORD, METADATA or entry_points.txt (the largest RECORDs: ~3 MiB)


def metadata_text(dist, name: str) -> str | None:
    """A distribution's metadata file `name` as text, None where it has none: a regular file, capped
    (a FIFO or a link to /dev/zero named RECORD is a BundleError, never a hang). A distribution that
    is no directory on disk (an egg, a custom finder's) is read through importlib.metadata."""
    where = getattr(dist, "_path", None)  # importlib.metadata.PathDistribution: its .dist-info directory
    if where is None:
        return dist.read_text(name)
    path = Path(str(where)) / name
    if not os.path.lexists(path):
        return None
    data = fsutil.read_regular(path, BundleError, MAX_METADATA_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"is not UTF-8 text ({e.reason} at byte {e.start})", file=path) from None


def ignore(cause: tuple, message: str) -> None:
    """A `warn` that drops what it is told (a caller that reports problems another way)."""


@dataclass(frozen=True)
class Source:
    """One place artifacts are served from: an installed bundle, or an artifact directory."""
    label: str
    root: Path                              # the bundle directory, or an artifact directory
    manifest: bundle.Manifest | None = None # None for a plain artifact directory
    dist: str | None = None                 # the distribution that installed the bundle
    package: str | None = ""                # the package whose kernels it owns (default: the manifest's); None: none
    recorded: bool = True                   # its distribution has a RECORD (an installer laid it out)
    refused: str = ""                       # why it owns no package (package None): said once, and by a miss

    def __post_init__(self):
        if self.package == "":
            object.__setattr__(self, "package", self.manifest.package if self.manifest is not None else None)

    def accept(self, dev: DeviceIdentity) -> tuple[str, ...]:
        """The match levels at which this source's artifacts tuned on `dev` may serve: the first of the
        manifest's targets that covers `dev` decides; a plain directory accepts the default levels."""
        if self.manifest is None:
            return DEFAULT_ACCEPT
        return next((t.accept for t in self.manifest.targets if t.covers(dev)), ())

    def served_level(self, tuned: DeviceIdentity, running: DeviceIdentity) -> str | None:
        """The level an artifact of this source tuned on `tuned` serves at on `running` (None: not served)."""
        return serving.served_level(tuned, running, self.accept(tuned))

    def shard(self, kernel: str) -> bundle.Shard | None:
        """`kernel`'s shard, capped and hash-checked; None when the bundle lists no such kernel."""
        info = self.manifest.kernels.get(kernel) if self.manifest is not None else None
        if info is None:
            return None
        path = self.root / info.shard
        return bundle.parse_shard(info, fsutil.read_regular(path, BundleError, bundle.MAX_SHARD_BYTES), file=path)

    def provenance(self, kernel: str) -> dict:
        """`kernel`'s provenance file (address -> provenance), capped and hash-checked; {} when none."""
        info = self.manifest.kernels.get(kernel) if self.manifest is not None else None
        if info is None:
            return {}
        path = self.root / info.provenance
        return bundle.parse_provenance(info, fsutil.read_regular(path, BundleError, bundle.MAX_SHARD_BYTES),
                                       file=path)


def discover(warn: Warn = ignore) -> list[Source]:
    """Every source, best first: FLYTUNE_ARTIFACT_DIR directories, then installed bundles."""
    return artifact_dirs(warn) + bundles(warn)


def artifact_dirs(warn: Warn = ignore) -> list[Source]:
    out = []
    for d, why in settings.current().refused_artifact_dirs:
        warn(("artifact-dir", d), f"FLYTUNE_ARTIFACT_DIR names {d!r}, which the file system cannot look up "
                                  f"({why}); ignored")
    for path in settings.current().artifact_dirs:
        d = str(path)
        try:
            is_dir = path.is_dir()
        except (OSError, ValueError):  # a name too long for the file system, or one it cannot hold
            is_dir = False
        if is_dir:
            out.append(Source(f"FLYTUNE_ARTIFACT_DIR {path}", path))
        else:
            warn(("artifact-dir", d), f"FLYTUNE_ARTIFACT_DIR names {d!r}, which is not a directory; ignored")
    return out


def bundles(warn: Warn = ignore) -> list[Source]:
    """Every installed bundle. A distribution without a RECORD (laid out by hand) owns its package only
    where no distribution an installer laid out owns it too: a hand-made dist-info naming another's
    `pkg._flytune` is no owner."""
    out, records = [], {}
    for dist_name, ep in sorted(entry_points(warn), key=lambda t: (t[1].name, t[1].value)):
        src = locate(ep, dist_name, warn, records)
        if src is not None:
            out.append(src)
    recorded = {s.package for s in out if s.recorded and s.package}
    for i, s in enumerate(out):
        if not s.recorded and s.package in recorded:
            why = f"its distribution has no RECORD and package {s.package} is another's (installed with a RECORD)"
            warn(("owner", s.label), f"{s.label}: {why}: it owns no kernel")
            out[i] = dataclasses.replace(s, package=None, refused=why)
    return out


def documents(src: Source, kernel: str, problems: list[str], listing: dict | None = None
              ) -> Iterator[tuple[dict, DeviceIdentity, str, str | None]]:
    """(artifact document, device, origin, file name or None) for every artifact of `kernel` in `src`,
    whatever its device; why an unreadable one was skipped goes to `problems`. `listing` caches a
    directory's files between calls (path -> files)."""
    if src.manifest is None:
        listing = {} if listing is None else listing
        files = listing.get(src.root)
        if files is None:
            try:  # bounded, one level (core.artifactdir)
                files = artifactdir.listing(src.root)
            except FlytuneError as e:
                problems.append(str(e))
                files = []
            listing[src.root] = files
        for path in files:
            if not path.name.startswith(kernel + "-"):
                continue
            try:  # a regular file, capped: a FIFO or a link to /dev/zero named like an artifact is refused
                art = Artifact.from_bytes(artifactdir.read(path), file=path)
            except FlytuneError as e:
                problems.append(str(e))
                continue
            if art.kernel == kernel:
                yield art.to_json(), art.device, str(path), path.name
        return
    try:
        shard = src.shard(kernel)
    except FlytuneError as e:
        problems.append(f"{e} (shard refused)")
        return
    if shard is None:
        return
    for row in shard.rows:
        doc = shard.doc(row)
        try:
            dev = device_of(doc["device"], src.label)
        except FlytuneError as e:
            problems.append(str(e))
            continue
        yield doc, dev, src.label, None


def device_of(d: Any, name: str) -> DeviceIdentity:
    """A device document parsed once per distinct device (a bundle holds few): `_device`'s cache."""
    try:
        if type(d["units"]) is int:  # not True or 1.0: they hash equal to 1
            return _device(tuple(d.items()))
    except (KeyError, TypeError, FlytuneError):  # not an object of scalars, or not a device: said below
        pass
    return DeviceIdentity.from_json(d, Fields(name, ArtifactError))


@functools.lru_cache(maxsize=256)
def _device(items: tuple) -> DeviceIdentity:
    """The one cache of this module (bounded; pure: the same document is the same device)."""
    return DeviceIdentity.from_json(dict(items), Fields("device", ArtifactError))


_NAME = re.compile(r"^Name:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def entry_points(warn: Warn = ignore) -> list[tuple[str, Any]]:
    """(distribution name, entry point) for `importlib.metadata.entry_points(group="flytune.bundles")`,
    without parsing the metadata and entry points of every installed distribution: a distribution's
    file is parsed only when it names the group. As there, a distribution shadowed by one of the same
    name earlier on sys.path is skipped, with one exception: an `<name>.egg-info` directory that
    declares no bundle (what a build or an editable install leaves in the project root, on sys.path
    when a program runs from there) is not an installation and does not hide the installed
    distribution's bundle."""
    from importlib.metadata import PackageNotFoundError, distribution, distributions

    header = f"[{bundle.ENTRY_POINT_GROUP}]"
    out, seen = [], set()
    for dist in distributions():
        try:  # one distribution's unreadable metadata (invalid UTF-8, a FIFO, a line without `=`) skips it alone
            text = metadata_text(dist, "entry_points.txt")
            meta = _metadata_text(dist) if text and header in text else ""
        except (ValueError, OSError, FlytuneError) as e:
            warn(("entry-points", str(e)), f"an installed distribution's metadata cannot be read "
                 f"({type(e).__name__}: {e}); it is skipped")
            continue
        if not text or header not in text:
            continue
        found = _NAME.search(meta)  # the one header needed: no full metadata parse
        name = found.group(1) if found else ""
        key = serving.normalize(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            first = distribution(name)
        except (PackageNotFoundError, ValueError):
            first = dist
        try:
            first_text = metadata_text(first, "entry_points.txt")
            if (first_text != text or _metadata_text(first) != meta) and not _build_leftover(first, first_text):
                dist = first  # the copy earlier on sys.path is the installed one
            out.extend((name, ep) for ep in dist.entry_points if ep.group == bundle.ENTRY_POINT_GROUP)
        except (ValueError, TypeError, OSError, FlytuneError) as e:  # a line without `=`: a TypeError there
            warn(("entry-points", name), f"distribution {name}: entry_points.txt cannot be parsed "
                 f"({type(e).__name__}: {e}); its bundle is ignored")
    return out


def _build_leftover(dist, entry_points: str | None) -> bool:
    """An egg-info directory (PKG-INFO, no METADATA) that declares no bundle: setuptools' by-product."""
    return (f"[{bundle.ENTRY_POINT_GROUP}]" not in (entry_points or "") and metadata_text(dist, "METADATA") is None
            and metadata_text(dist, "PKG-INFO") is not None)


def _metadata_text(dist) -> str:
    return metadata_text(dist, "METADATA") or metadata_text(dist, "PKG-INFO") or ""


def locate(ep, dist_name: str | None = None, warn: Warn = ignore, records: dict | None = None) -> Source | None:
    """The bundle an entry point names, read without importing the package: its value is a dotted
    module name (`<package>._flytune`, or an editable wheel's), looked up inside the distribution's own
    files, never a path and never wherever the import system would find that name. Whether the bundle
    owns its package's kernels is `Source.package` (`ownership`; why not: `Source.refused`, warned once).
    `records` keeps a site directory's RECORDs between calls (`claimants`)."""
    name = dist_name or (ep.dist.name if ep.dist else ep.name)
    label = f"{name} bundle"
    parts = serving.bundle_parts(ep.value)
    if parts is None:
        warn(("manifest", ep.value), f"{label}: entry point {ep.name} = {ep.value!r} in group "
             f"{bundle.ENTRY_POINT_GROUP} is not a dotted module name (a path is never followed); bundle ignored")
        return None
    rel = "/".join(parts)
    record = record_of(ep.dist, warn)
    if ep.dist is None or (record is not None and f"{rel}/{bundle.MANIFEST}" not in record):
        warn(("manifest", ep.value), f"{label}: entry point {ep.name} = {ep.value!r} in group "
             f"{bundle.ENTRY_POINT_GROUP}: no {rel}/{bundle.MANIFEST} among the distribution's own files; "
             f"bundle ignored")
        return None
    root = Path(ep.dist.locate_file(rel))
    manifest_path = root / bundle.MANIFEST
    try:
        data = fsutil.read_regular(manifest_path, BundleError, bundle.MAX_MANIFEST_BYTES)
        manifest = bundle.Manifest.from_bytes(data, file=manifest_path)
    except BundleError as e:
        if not os.path.lexists(manifest_path):
            warn(("manifest", ep.value), f"entry point {ep.name} = {ep.value!r} in group "
                 f"{bundle.ENTRY_POINT_GROUP}: no {bundle.MANIFEST} found; bundle ignored")
        else:
            warn(("manifest", str(manifest_path)), f"{e}; bundle ignored, the next tier serves")
        return None
    except FlytuneError as e:
        warn(("manifest", str(manifest_path)), f"{e}; bundle ignored, the next tier serves")
        return None
    owner = ownership(ep.value, manifest, record, ep.dist, name, records)
    if owner.package is None and manifest.kernels:
        warn(owner.cause or ("owner", label), f"{label}: entry point {ep.value!r} with manifest package "
             f"{manifest.package!r}: the distribution does not own that package: {owner.why}; so the bundle "
             f"owns no kernel (its artifacts serve only as an accepted config pack)")
    return Source(label, root, manifest, name, owner.package, record is not None, owner.why)


class Ownership(NamedTuple):  # a bundle's package, or None and why not (`cause`: one warning for all it disowns)
    package: str | None
    why: str = ""
    cause: tuple = ()


def ownership(value: str, manifest: bundle.Manifest, record: set[str] | None, dist, dist_name: str = "",
              records: dict | None = None) -> Ownership:
    """Whether a bundle owns its manifest's package P, and why not: an editable wheel's, where its source
    tree (direct_url.json) holds the directory P is imported from (`import_location`); any other, where
    its entry point names P's bundle, its RECORD owns P (core.serving.disowned; no RECORD: the manifest's
    word) unless another's claim undoes it (`claimants`, core.serving.contest), and P is imported from
    where it was installed or from the distribution's own source tree (`source_tree`)."""
    package, name = manifest.package, dist_name or getattr(dist, "name", None) or "?"
    places = import_location(package)
    where = ", ".join(map(str, places)) or "nowhere"
    if serving.is_editable_value(value):
        tree = _editable_tree(dist)
        if tree is not None and places and _inside(places, tree):
            return Ownership(package)
        return Ownership(None, f"it is an editable install whose source tree ({tree or 'none recorded'}) does not "
                               f"hold package {package}, imported from {where}")
    if serving.bundle_package(value) != package:
        return Ownership(None, f"its entry point names {value!r}, not {serving.bundle_value(package)!r}")
    if not places:
        return Ownership(None, f"package {package} cannot be imported here")
    site, contested = Path(dist.locate_file("")), []
    why = "" if record is None else serving.disowned(
        record, package, lambda rel: os.path.lexists(site / rel),
        lambda init, parent: _shared(site, init, parent, package, name, records, contested, record))
    if why:
        return Ownership(None, why, contested[0] if contested else ())
    installed_at = Path(dist.locate_file("/".join(serving.bundle_parts(value) or ()))).parent
    if not _inside([installed_at], *places) and source_tree(places, package, name) is None:
        return Ownership(None, f"package {package} is imported from {where}, not from {installed_at}, where {name} "
                               f"installed it with this bundle, and that is not {name}'s source tree (no egg-info or "
                               f"pyproject.toml of {name} beside it): run elsewhere, or `pip install -e .` that tree")
    return Ownership(package)


def _shared(site: Path, init: str, parent: str, package: str, name: str, records: dict | None,
            contested: list, record: set[str]) -> str:
    """Why other distributions of `site` listing `init` (`parent`'s) undo the claim of `name`, whose bundle
    is `package`'s ('' where it stands: core.serving.contested); an ambiguity's cause goes into `contested`."""
    me = serving.normalize(name)
    claims = {shown: (_ships_bundle(text, info, parent), serving.modules(text.splitlines(), parent))
              for n, (shown, text, info) in claimants(site, init, records).items() if n != me}
    if not claims:
        return ""
    claims[name] = (parent == package, serving.modules(record, parent))  # its entry point names `package`'s
    namespace = _namespace_stub(site / init)
    if not serving.contest(claims, namespace):
        contested.append(("owner-ambiguous", str(site / init)))
    return serving.contested(f"{init} (in {site})", parent, name, claims, namespace)


def claimants(site: Path, rel: str, records: dict | None = None) -> dict[str, tuple[str, str, Path]]:
    """The distributions of `site` whose RECORD lists `rel`: normalised name -> (name as its `.dist-info`
    directory spells it, RECORD text, that directory). `records` keeps a site's RECORDs between calls."""
    listed = (records or {}).get(site)
    if listed is None:
        try:
            infos = sorted(e for e in os.listdir(site) if e.endswith(".dist-info"))
        except OSError:
            infos = []
        listed = []
        for info in infos:  # read as bytes, decoded only where they list `rel`: a site's RECORDs are megabytes
            try:
                listed.append((info.rsplit(".", 1)[0].split("-", 1)[0], fsutil.read_regular(
                    site / info / "RECORD", BundleError, MAX_METADATA_BYTES), site / info))
            except FlytuneError:  # none (laid out by hand), or no regular file: it claims nothing
                continue
        if records is not None:
            records[site] = listed
    needle = f"\n{rel},".encode()
    return {serving.normalize(shown): (shown, "\n" + data.decode("utf-8", "replace"), info)
            for shown, data, info in reversed(listed) if data.startswith(needle[1:]) or needle in data}


def _ships_bundle(text: str, info: Path, package: str) -> bool:
    """Whether the distribution of `info` (its RECORD `text`) ships `package`'s own bundle: its entry point
    `<package>._flytune`, the manifest among its files and on disk."""
    from importlib.metadata import PathDistribution

    manifest = serving.bundle_prefix(package) + bundle.MANIFEST
    if f"\n{manifest}," not in text or not os.path.lexists(info.parent / manifest):
        return False
    try:
        return any(ep.group == bundle.ENTRY_POINT_GROUP and ep.value.strip() == serving.bundle_value(package)
                   for ep in PathDistribution(info).entry_points)
    except (ValueError, TypeError, OSError):
        return False


def _namespace_stub(path: Path) -> bool:
    """Whether an `__init__.py` is a pkgutil / pkg_resources namespace stub (every portion lists it)."""
    try:
        data = fsutil.read_regular(path, BundleError, 1 << 16)
        return b"extend_path" in data or b"declare_namespace" in data
    except FlytuneError:
        return False


def source_tree(places: list[Path], package: str, dist_name: str) -> Path | None:
    """What shows that `package`, imported from `places` (a source tree first on sys.path: run from the
    project root), is `dist_name`'s own source: beside its top package, the egg-info a setuptools build
    leaves (PKG-INFO's Name) or the pyproject.toml (`[project] name`, flat or src layout); else None."""
    from .project import read_toml

    base = places[0].parents[package.count(".")] if len(places) == 1 else None
    try:
        eggs = [base / e / "PKG-INFO" for e in os.listdir(base) if e.endswith(".egg-info")][:64] if base else []
    except OSError:
        eggs = []
    for path in [*eggs, base / "pyproject.toml", base.parent / "pyproject.toml"] if base else ():
        try:
            if path.name == "PKG-INFO":
                found = _NAME.search(fsutil.read_regular(path, BundleError, 1 << 20).decode("utf-8", "replace"))
                name = found.group(1) if found else None
            else:
                project = read_toml(path).get("project") if os.path.lexists(path) else None
                name = project.get("name") if isinstance(project, dict) else None
        except FlytuneError:
            continue
        if isinstance(name, str) and serving.normalize(name) == serving.normalize(dist_name):
            return path
    return None


def import_location(package: str) -> list[Path]:
    """The directories the interpreter imports `package` from (one, or a namespace package's
    portions): its own, where it is imported; else as the import system's finders would find it,
    parents included, without importing anything. [] where it cannot be found."""
    parts = package.split(".")
    path = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        if module is not None:  # imported: where it really imports from (a package may set its own __path__)
            path = getattr(module, "__path__", None)
            if path is None:
                return [Path(module.__file__).parent] if getattr(module, "__file__", None) else []
            path = list(path)
            continue
        spec = _find(name, path)
        path = spec.submodule_search_locations if spec is not None else None
        if path is None:
            return []
    return [Path(p) for p in path]


def _find(name: str, path):
    """`name`'s spec from the finders on sys.meta_path (an editable install's too), as `import` would
    ask them, executing no module."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except Exception:  # noqa: BLE001 - a finder's own failure finds nothing, as for import
            continue
        if spec is not None:
            return spec
    return None


def _inside(paths, *roots: Path) -> bool:
    """Whether every one of `paths` is one of `roots` or lies under one (resolved: links followed)."""
    try:
        resolved = [r.resolve() for r in roots]
        return all(any(p.resolve() == r or p.resolve().is_relative_to(r) for r in resolved) for p in paths)
    except (OSError, ValueError):
        return False


def _editable_tree(dist) -> Path | None:
    """The source tree of an editable install (PEP 610 direct_url.json: `dir_info.editable`, a file
    URL); None for any other distribution."""
    import urllib.parse
    import urllib.request  # only where a bundle is an editable install's: not on every import

    try:
        text = metadata_text(dist, "direct_url.json") if dist is not None else None
        doc = json.loads(text) if text and len(text) < 65536 else None
    except (ValueError, OSError, FlytuneError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("dir_info"), dict) or \
            doc["dir_info"].get("editable") is not True or not isinstance(doc.get("url"), str):
        return None
    url = urllib.parse.urlsplit(doc["url"])
    if url.scheme != "file" or url.netloc not in ("", "localhost"):
        return None
    return Path(urllib.request.url2pathname(url.path))


def record_of(dist, warn: Warn = ignore) -> set[str] | None:
    """The distribution's own files (its RECORD), as posix paths; None when it has no RECORD (a
    distribution laid out by hand, not by an installer)."""
    if dist is None:
        return None
    try:
        text = metadata_text(dist, "RECORD")
        if text is None:
            return None
        # the first column, as importlib.metadata reads it, without making a PackagePath per line
        # (a 14,600-line RECORD: 15 ms instead of 93)
        return {row[0].replace("\\", "/") for row in csv.reader(text.splitlines()) if row}
    except (ValueError, OSError, csv.Error, FlytuneError) as e:
        warn(("record", str(e)), f"a distribution's RECORD cannot be read ({type(e).__name__}: {e}); "
             f"its bundle is ignored")
        return set()
