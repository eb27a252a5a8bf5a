"""The offline tier: bundles registered by installed wheels, overridden by FLYTUNE_ARTIFACT_DIR.

Discovery is lazy and happens once per process: entry points in group `flytune.bundles` name a
package whose `_flytune/` directory holds the bundle; nothing is imported to find it. Each kernel's
shard is read, hash-checked and indexed on that kernel's first call, and never again.

Ownership (core.serving): an entry point's value is a dotted module name inside its distribution's
own files (RECORD, where there is one); the bundle owns the kernels under its package when that
distribution installs the package itself. For any other kernel a bundle is a config pack, served
only where the kernel's owner accepts it (`[tool.flytune] packs`, carried in its manifest) or the
user opts in (FLYTUNE_PACKS), and only for keys the owner lacks (`Hit.pack` names it).
"""
from __future__ import annotations

import csv
import json
import operator
import os
import re
import sys
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple

from ..core import artifactdir, bundle, fsutil, serving, settings
from ..core.artifact import Artifact
from ..core.device import DeviceIdentity
from ..core.errors import ArtifactError, BundleError, FlytuneError
from ..core.target import DEFAULT_ACCEPT
from . import warning


class Hit:
    """One served artifact (a plain slotted class: an index makes one per tuned shape)."""

    __slots__ = ("config", "level", "name", "origin", "pack", "source")

    def __init__(self, config: dict, level: str, origin: str, source, name: str | None = None,
                 pack: str | None = None):
        self.config = config  # the artifact's config document, validated when the kernel accepts it
        self.level = level    # match level against the running device
        self.origin = origin  # where it came from: "<dist> bundle" or an artifact file path
        self.source = source  # the artifact document, or (shard, row) to make it from when needed
        self.name = name
        self.pack = pack      # the distribution of the config pack it came from; None: the owner's, or a directory

    def __repr__(self) -> str:
        return f"Hit(config={self.config!r}, level={self.level!r}, origin={self.origin!r})"

    @property
    def artifact(self) -> str:
        """The artifact's file name (its content address), computed when needed."""
        return self.name or _name(self.document())

    def document(self) -> dict:
        if type(self.source) is tuple:
            shard, row = self.source
            return shard.doc(row)
        return self.source


class Index:
    """One kernel's artifacts for the running device: key tuple -> best hit, made on demand.

    A bundle's kernel may hold thousands of tuned shapes: the index maps their keys in bulk and
    builds the `Hit` of a key only when that key is looked up.
    """

    __slots__ = ("_tuned", "entries", "other_devices", "problems")

    def __init__(self):
        self.entries: dict[tuple, Any] = {}  # key -> Hit, or (_Rows, row) to make one from
        self.other_devices: set[str] = set()  # devices seen that did not match
        self.problems: list[str] = []
        self._tuned: dict[str, list] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def hit(self, key: tuple) -> Hit | None:
        entry = self.entries.get(key)
        if entry is None or type(entry) is Hit:
            return entry
        rows, row = entry
        hit = self.entries[key] = Hit(rows.shard.configs[row[1]], rows.level, rows.label, (rows.shard, row),
                                      pack=rows.pack)
        return hit

    def refuse(self, key: tuple) -> Hit | None:
        """Take `key`'s hit out of the index (a config pack's config that failed to launch: the owner
        never accepted it, so the next tier serves the key from now on); returns it."""
        hit = self.hit(key)
        self.entries.pop(key, None)
        return hit

    @property
    def hits(self) -> dict[tuple, Hit]:
        """Every key's Hit (builds them all: for tools and tests, not the call path)."""
        return {key: self.hit(key) for key in list(self.entries)}

    def tuned(self, axis: str, axes: tuple[str, ...]) -> list:
        """The tuned values of one axis, sorted (numbers first): what `nearest` snaps to."""
        if axis not in self._tuned:
            i = axes.index(axis)
            self._tuned[axis] = sorted({key[i] for key in self.entries}, key=_order)
        return self._tuned[axis]


class _Rows(NamedTuple):
    """What the rows of one shard served at one level share."""
    shard: bundle.Shard
    level: str
    label: str
    pack: str | None


@dataclass(frozen=True)
class _Source:
    label: str
    root: Path                              # the bundle directory, or an artifact directory
    manifest: bundle.Manifest | None = None # None for a plain artifact directory
    dist: str | None = None                 # the distribution that installed the bundle
    package: str | None = ""                # the package whose kernels it owns (default: the manifest's); None: none

    def __post_init__(self):
        if self.package == "":
            object.__setattr__(self, "package", self.manifest.package if self.manifest is not None else None)


class OfflineTier:
    def __init__(self):
        self._sources: list[_Source] | None = None
        self._dir_files: dict[Path, list[Path]] = {}

    def reset(self) -> None:
        self._sources = None
        self._dir_files = {}

    def sources(self) -> list[_Source]:
        if self._sources is None:
            self._sources = _artifact_dirs() + _bundles()
        return self._sources

    def ranked(self, kernel: str) -> list[tuple[tuple, _Source]]:
        """The sources that may serve `kernel`, each with its rank (core.serving: the user's artifact
        directories, then the owner's bundle, then the config packs accepted for it), in order."""
        sources = self.sources()
        owner = serving.owner(kernel, [s.package for s in sources if s.package is not None])
        accepted = {p for s in sources if owner is not None and s.package == owner for p in s.manifest.packs}
        out = []
        for order, src in enumerate(sources):
            if src.manifest is None:
                out.append(((serving.USER, order), src))
            elif owner is not None and src.package == owner:
                out.append(((serving.OWNER, order), src))
            elif kernel in src.manifest.kernels:
                if serving.pack_accepted(src.dist or "", accepted, settings.current().packs):
                    out.append(((serving.PACK, order), src))
                else:
                    warning.once(("pack", src.label, kernel), f"{src.label}: holds artifacts for {kernel}, which it "
                                 f"does not own ({owner or 'no installed bundle'} does): a config pack, not accepted "
                                 f"by the owner's [tool.flytune] packs nor FLYTUNE_PACKS; ignored")
        return out

    def index(self, kernel: str, axes: tuple[str, ...], device: DeviceIdentity) -> Index:
        """Every artifact of `kernel` usable on `device`; per key, the best (core.serving.best)."""
        idx = Index()
        groups = []  # (rank, keys, entries): each group's entries share one rank
        for source_rank, src in self.ranked(kernel):
            pack = src.dist if source_rank[0] == serving.PACK else None
            found = (self._dir_groups(src, kernel, axes, device, idx) if src.manifest is None else
                     self._shard_groups(src, kernel, axes, device, idx, pack))
            for level, keys, entries in found:
                groups.append((serving.rank(source_rank, level), keys, entries))
        idx.entries = serving.best(groups)
        idx.problems = summarise(idx.problems)
        return idx

    def _shard_groups(self, src: _Source, kernel: str, axes: tuple[str, ...], device: DeviceIdentity, idx: Index,
                      pack: str | None = None):
        shard = self._shard(src, kernel, idx)
        if shard is None:
            return
        if sorted(shard.axes) != sorted(axes):
            idx.problems.append(str(_axes_error(shard.axes, axes, f"{src.label}: {kernel}")))
            return
        levels = []  # per device of the shard (a shard holds few): the level it is served at, or None
        for d in shard.devices:
            try:
                dev = _device_of(d, src.label)
            except FlytuneError as e:
                idx.problems.append(str(e))
                levels.append(None)
                continue
            accept = next((t.accept for t in src.manifest.targets if t.covers(dev)), ())
            levels.append(_served_level(dev, device, accept, idx))
        if len(levels) == 1:
            by_device = {0: shard.rows}
        else:
            by_device = {}
            for row in shard.rows:
                by_device.setdefault(row[0], []).append(row)
        pick = [2 + shard.axes.index(a) for a in axes]
        for di, rows in by_device.items():
            if levels[di] is None:
                continue
            if len(pick) == 1:
                keys = [(row[pick[0]],) for row in rows]
            else:
                keys = list(map(operator.itemgetter(*pick), rows))
            yield levels[di], keys, list(zip(repeat(_Rows(shard, levels[di], src.label, pack)), rows))

    def _dir_groups(self, src: _Source, kernel: str, axes: tuple[str, ...], device: DeviceIdentity, idx: Index):
        levels: dict[DeviceIdentity, str | None] = {}
        axis_set = set(axes)
        found: dict[str, tuple[list, list]] = {}
        for doc, dev, _, origin, name in self.documents(src, kernel, idx):
            key = doc["key"]
            if key.keys() != axis_set:
                idx.problems.append(str(_axes_error(key, axes, name)))
                continue
            if dev not in levels:
                levels[dev] = _served_level(dev, device, DEFAULT_ACCEPT, idx)
            level = levels[dev]
            if level is not None:
                keys, hits = found.setdefault(level, ([], []))
                keys.append(tuple([key[a] for a in axes]))
                hits.append(Hit(doc["config"], level, origin, doc, name))
        for level, (keys, hits) in found.items():
            yield level, keys, hits  # within a group, the first file wins (core.serving.best)

    def _shard(self, src: _Source, kernel: str, idx: Index) -> bundle.Shard | None:
        info = src.manifest.kernels.get(kernel)
        if info is None:
            return None
        path = src.root / info.shard
        try:
            return bundle.parse_shard(info, fsutil.read_regular(path, BundleError, bundle.MAX_SHARD_BYTES), file=path)
        except FlytuneError as e:
            idx.problems.append(f"{e} (shard refused)")
        return None

    def documents(self, src: _Source, kernel: str, idx: Index | None = None):
        """Yield (artifact document, device, accepted levels, origin, file name or None) for every
        artifact of `kernel` in `src` (one of `sources()`), whatever its device; why an unreadable one
        was skipped goes to `idx.problems`."""
        idx = Index() if idx is None else idx
        if src.manifest is None:
            files = self._dir_files.get(src.root)
            if files is None:
                try:  # bounded, one level (core.artifactdir): listed once per process
                    files = artifactdir.listing(src.root)
                except FlytuneError as e:
                    idx.problems.append(str(e))
                    files = []
                self._dir_files[src.root] = files
            for path in files:
                if not path.name.startswith(kernel + "-"):
                    continue
                try:  # a regular file, capped: a FIFO or a link to /dev/zero named like an artifact is refused
                    art = Artifact.from_bytes(artifactdir.read(path), file=path)
                except FlytuneError as e:
                    idx.problems.append(str(e))
                    continue
                if art.kernel == kernel:
                    yield art.to_json(), art.device, DEFAULT_ACCEPT, str(path), path.name
            return
        shard = self._shard(src, kernel, idx)
        if shard is None:
            return
        for row in shard.rows:
            doc = shard.doc(row)
            try:
                dev = _device_of(doc["device"], src.label)
            except FlytuneError as e:
                idx.problems.append(str(e))
                continue
            accept = next((t.accept for t in src.manifest.targets if t.covers(dev)), ())
            yield doc, dev, accept, src.label, None


SHOWN = 3  # problems named in full; the rest are counted (10,000 bad files are one warning, not 10,000)


def summarise(problems: list[str]) -> list[str]:
    """At most one line per problem for a few; for more, one line with the count and the first few."""
    if len(problems) <= SHOWN:
        return problems
    return [f"{len(problems)} artifact files or entries ignored; the first {SHOWN}: " + "; ".join(problems[:SHOWN])]


def _served_level(dev: DeviceIdentity, running: DeviceIdentity, accept, idx: Index) -> str | None:
    level = serving.served_level(dev, running, accept)
    if level is None:
        idx.other_devices.add(not_served(dev, running))
    return level


def not_served(dev: DeviceIdentity, running: DeviceIdentity) -> str:
    """How `Index.other_devices` names a device whose artifacts are not served on `running`."""
    level = serving.match_level(dev, running)
    return dev.spec() if level is None else f"{dev.spec()} ({level} not accepted)"


def _order(v: Any):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _name(doc: dict) -> str:
    try:
        return Artifact.from_json(doc).filename
    except FlytuneError:
        return "<invalid artifact>"


def _axes_error(got: Any, axes: tuple[str, ...], name: str) -> FlytuneError:
    return ArtifactError(f"has key axes {sorted(got)}, but the kernel declares {sorted(axes)}", file=name, field="key")


def _device_of(d: Any, name: str) -> DeviceIdentity:
    """Parse a device document once per distinct device (a bundle holds few)."""
    try:
        if type(d["units"]) is int:  # not True or 1.0: they hash equal to 1
            return _devices[tuple(d.items())]
    except (KeyError, TypeError):  # not seen yet, or not an object of scalars
        pass
    from ..core.codec import Fields
    from ..core.errors import ArtifactError

    dev = DeviceIdentity.from_json(d, Fields(name, ArtifactError))
    if type(d.get("units")) is int:
        _devices[tuple(d.items())] = dev
    return dev


def _artifact_dirs() -> list[_Source]:
    out = []
    for path in settings.current().artifact_dirs:
        d = str(path)
        if path.is_dir():
            out.append(_Source(f"FLYTUNE_ARTIFACT_DIR {path}", path))
        else:
            warning.once(("artifact-dir", d), f"FLYTUNE_ARTIFACT_DIR names {d!r}, which is not a directory; ignored")
    return out


def _bundles() -> list[_Source]:
    out = []
    for dist_name, ep in sorted(bundle_entry_points(), key=lambda t: (t[1].name, t[1].value)):
        src = locate(ep, dist_name)
        if src is not None:
            out.append(src)
    return out


_NAME = re.compile(r"^Name:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def bundle_entry_points() -> list[tuple[str, Any]]:
    """(distribution name, entry point) for `importlib.metadata.entry_points(group="flytune.bundles")`,
    without parsing the metadata and entry points
    of every installed distribution: a distribution's file is parsed only when it names the group.
    As there, a distribution shadowed by one of the same name earlier on sys.path is skipped, with one
    exception: an `<name>.egg-info` directory that declares no bundle (what a build or an editable
    install leaves in the project root, on sys.path when a program runs from there) is not an
    installation and does not hide the installed distribution's bundle."""
    from importlib.metadata import PackageNotFoundError, distribution, distributions

    header = f"[{bundle.ENTRY_POINT_GROUP}]"
    out, seen = [], set()
    for dist in distributions():
        try:  # one distribution's unreadable metadata (invalid UTF-8, a line without `=`) skips it alone
            text = dist.read_text("entry_points.txt")
        except (ValueError, OSError) as e:
            warning.once(("entry-points", str(e)), f"an installed distribution's entry_points.txt cannot be read "
                         f"({type(e).__name__}: {e}); it is skipped")
            continue
        if not text or header not in text:
            continue
        meta = _metadata_text(dist)
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
            first_text = first.read_text("entry_points.txt")
            if (first_text != text or _metadata_text(first) != meta) and not _build_leftover(first, first_text):
                dist = first  # the copy earlier on sys.path is the installed one
            out.extend((name, ep) for ep in dist.entry_points if ep.group == bundle.ENTRY_POINT_GROUP)
        except (ValueError, TypeError, OSError) as e:  # a line without `=` is a TypeError in importlib.metadata
            warning.once(("entry-points", name), f"distribution {name}: entry_points.txt cannot be parsed "
                         f"({type(e).__name__}: {e}); its bundle is ignored")
    return out


def _build_leftover(dist, entry_points: str | None) -> bool:
    """An egg-info directory (PKG-INFO, no METADATA) that declares no bundle: setuptools' by-product."""
    return (f"[{bundle.ENTRY_POINT_GROUP}]" not in (entry_points or "") and dist.read_text("METADATA") is None
            and dist.read_text("PKG-INFO") is not None)


def _metadata_text(dist) -> str:
    return dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""


def locate(ep, dist_name: str | None = None) -> _Source | None:
    """The bundle an entry point names, read without importing the package: its value is a dotted
    module name (`<package>._flytune`, or an editable wheel's), looked up inside the distribution's own
    files, never a path and never wherever the import system would find that name. Whether the bundle
    owns its package's kernels is `_Source.package` (`owned_package`)."""
    name = dist_name or (ep.dist.name if ep.dist else ep.name)
    label = f"{name} bundle"
    parts = serving.bundle_parts(ep.value)
    if parts is None:
        warning.once(("manifest", ep.value), f"{label}: entry point {ep.name} = {ep.value!r} in group "
                     f"{bundle.ENTRY_POINT_GROUP} is not a dotted module name (a path is never followed); "
                     f"bundle ignored")
        return None
    rel = "/".join(parts)
    record = _record(ep.dist)
    if ep.dist is None or (record is not None and f"{rel}/{bundle.MANIFEST}" not in record):
        warning.once(("manifest", ep.value), f"{label}: entry point {ep.name} = {ep.value!r} in group "
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
            warning.once(("manifest", ep.value), f"entry point {ep.name} = {ep.value!r} in group "
                         f"{bundle.ENTRY_POINT_GROUP}: no {bundle.MANIFEST} found; bundle ignored")
        else:
            warning.once(("manifest", str(manifest_path)), f"{e}; bundle ignored, the next tier serves")
        return None
    except FlytuneError as e:
        warning.once(("manifest", str(manifest_path)), f"{e}; bundle ignored, the next tier serves")
        return None
    package = owned_package(ep.value, manifest, record, ep.dist)
    if package is None and manifest.kernels:
        warning.once(("owner", label), f"{label}: entry point {ep.value!r} with manifest package "
                     f"{manifest.package!r}: the distribution does not own that package (it does not install "
                     f"it itself, another distribution installs its __init__.py, or an editable install's source "
                     f"tree does not hold it), so the bundle owns no kernel (its artifacts serve only as an "
                     f"accepted config pack)")
    return _Source(label, root, manifest, name, package)


def owned_package(value: str, manifest: bundle.Manifest, record: set[str] | None, dist=None) -> str | None:
    """The package whose kernels a bundle owns: the manifest's, when the entry point names that
    package's bundle and the distribution owns the package (core.serving.owns, against its RECORD and
    the files beside it), or when the entry point is an editable wheel's and the install's source tree
    (its direct_url.json) holds the package; None otherwise. A distribution without a RECORD (laid out
    by hand, not by an installer) is taken at its manifest's word."""
    package = manifest.package
    if serving.is_editable_value(value):
        tree = _editable_tree(dist)
        return package if tree is not None and _tree_holds(tree, package) else None
    if serving.bundle_package(value) != package:
        return None
    if record is not None and (dist is None or not serving.owns(
            record, package, lambda rel: os.path.lexists(dist.locate_file(rel)))):
        return None
    return package


def _editable_tree(dist) -> Path | None:
    """The source tree of an editable install (PEP 610 direct_url.json: `dir_info.editable`, a file
    URL); None for any other distribution."""
    import urllib.parse
    import urllib.request  # only where a bundle is an editable install's: not on every import

    try:
        text = dist.read_text("direct_url.json") if dist is not None else None
        doc = json.loads(text) if text and len(text) < 65536 else None
    except (ValueError, OSError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("dir_info"), dict) or \
            doc["dir_info"].get("editable") is not True or not isinstance(doc.get("url"), str):
        return None
    url = urllib.parse.urlsplit(doc["url"])
    if url.scheme != "file" or url.netloc not in ("", "localhost"):
        return None
    return Path(urllib.request.url2pathname(url.path))


def _tree_holds(tree: Path, package: str) -> bool:
    """Whether `package` is imported from inside `tree`: where it is already imported, its own
    locations; otherwise `tree/<package>` or `tree/src/<package>` with an `__init__.py` (nothing is
    imported to find out)."""
    module = sys.modules.get(package)
    spec = getattr(module, "__spec__", None)
    places = [Path(p) for p in (getattr(spec, "submodule_search_locations", None) or ())]
    if module is not None and not places and getattr(module, "__file__", None):
        places = [Path(module.__file__).parent]
    if module is None:
        rel = package.replace(".", "/")
        places = [d for d in (tree / rel, tree / "src" / rel) if (d / "__init__.py").is_file()]
    try:
        root = tree.resolve()
        return any(p.resolve().is_relative_to(root) for p in places)
    except (OSError, ValueError):
        return False


def _record(dist) -> set[str] | None:
    """The distribution's own files (its RECORD), as posix paths; None when it has no RECORD (a
    distribution laid out by hand, not by an installer)."""
    if dist is None:
        return None
    try:
        text = dist.read_text("RECORD")
        if text is None:
            return None
        # the first column, as importlib.metadata reads it, without making a PackagePath per line
        # (a 14,600-line RECORD: 15 ms instead of 93)
        return {row[0].replace("\\", "/") for row in csv.reader(text.splitlines()) if row}
    except (ValueError, OSError, csv.Error) as e:
        warning.once(("record", str(e)), f"a distribution's RECORD cannot be read ({type(e).__name__}: {e}); "
                     f"its bundle is ignored")
        return set()


_devices: dict[tuple, DeviceIdentity] = {}
TIER = OfflineTier()
