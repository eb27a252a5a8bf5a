"""The offline tier: bundles registered by installed wheels, overridden by FLYTUNE_ARTIFACT_DIR.

Discovery is lazy and happens once per process: entry points in group `flytune.bundles` name a
package whose `_flytune/` directory holds the bundle; nothing is imported to find it. Each kernel's
shard is read, hash-checked and indexed on that kernel's first call, and never again.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import bundle, warning
from .artifact import Artifact
from .device import DeviceIdentity
from .errors import FlytuneError
from .target import DEFAULT_ACCEPT, LEVELS, match_level


@dataclass(frozen=True)
class Hit:
    config: dict          # the artifact's config document, validated when the kernel accepts it
    level: str            # match level against the running device
    origin: str           # where it came from: "<dist> bundle" or an artifact file path
    doc: dict = field(repr=False)
    name: str | None = None

    @property
    def artifact(self) -> str:
        """The artifact's file name (its content address), computed when needed."""
        return self.name or _name(self.doc)


@dataclass
class Index:
    """One kernel's artifacts for the running device: key tuple -> best Hit."""
    hits: dict = field(default_factory=dict)
    tuned_values: dict = field(default_factory=dict)     # axis -> sorted tuned values (for nearest)
    other_devices: set = field(default_factory=set)      # devices seen that did not match
    problems: list = field(default_factory=list)


@dataclass(frozen=True)
class _Source:
    label: str
    root: Path                              # the bundle directory, or an artifact directory
    manifest: bundle.Manifest | None = None # None for a plain artifact directory


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

    def index(self, kernel: str, axes: tuple[str, ...], device: DeviceIdentity) -> Index:
        """Every artifact of `kernel` usable on `device`, best source and level first."""
        idx = Index()
        rank: dict[tuple, tuple[int, int]] = {}
        for order, src in enumerate(self.sources()):
            for doc, dev, accept, origin, name in self._docs(src, kernel, idx):
                try:
                    key = _key_of(doc, axes, name or origin)
                except FlytuneError as e:
                    idx.problems.append(str(e))
                    continue
                level = match_level(dev, device)
                if level is None or level not in accept:
                    idx.other_devices.add(dev.spec() if level is None else f"{dev.spec()} ({level} not accepted)")
                    continue
                r = (order, LEVELS.index(level))
                if key not in rank or r < rank[key]:
                    rank[key] = r
                    idx.hits[key] = Hit(doc.get("config"), level, origin, doc, name)
                for axis, value in zip(axes, key):
                    idx.tuned_values.setdefault(axis, set()).add(value)
        idx.tuned_values = {a: sorted(v, key=_order) for a, v in idx.tuned_values.items()}
        return idx

    def _docs(self, src: _Source, kernel: str, idx: Index):
        if src.manifest is None:
            files = self._dir_files.get(src.root)
            if files is None:
                files = self._dir_files[src.root] = sorted(src.root.glob("*.json"))
            for path in files:
                if not path.name.startswith(kernel + "-"):
                    continue
                try:
                    art = Artifact.load(path)
                except FlytuneError as e:
                    idx.problems.append(str(e))
                    continue
                if art.kernel == kernel:
                    yield art.to_json(), art.device, DEFAULT_ACCEPT, str(path), path.name
            return
        info = src.manifest.kernels.get(kernel)
        if info is None:
            return
        shard = src.root / info.shard
        try:
            docs = bundle.parse_shard(info, shard.read_bytes(), file=shard)
        except OSError as e:
            idx.problems.append(f"{shard}: cannot be read: {e.strerror}")
            return
        except FlytuneError as e:
            idx.problems.append(f"{e} (shard refused)")
            return
        accept_by_target = [(t, t.accept) for t in src.manifest.targets]
        for doc in docs:
            try:
                dev = _device_of(doc, src.label)
            except FlytuneError as e:
                idx.problems.append(str(e))
                continue
            accept = next((a for t, a in accept_by_target if t.covers(dev)), ())
            yield doc, dev, accept, src.label, None  # the file name is computed only for a served hit


def _order(v: Any):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _name(doc: dict) -> str:
    try:
        return Artifact.from_json(doc).filename
    except FlytuneError:
        return "<invalid artifact>"


def _key_of(doc: Any, axes: tuple[str, ...], name: str) -> tuple:
    key = doc.get("key") if type(doc) is dict else None
    if type(key) is not dict or len(key) != len(axes) or any(a not in key for a in axes):
        got = sorted(key) if isinstance(key, dict) else key
        raise FlytuneError(f"has key axes {got}, but the kernel declares {sorted(axes)}", file=name, field="key")
    return tuple([key[a] for a in axes])


def _device_of(doc: Any, name: str) -> DeviceIdentity:
    """Parse a device document once per distinct device (a bundle holds few)."""
    d = doc.get("device") if type(doc) is dict else None
    memo = (d.get("backend"), d.get("arch"), d.get("name"), d.get("units")) if type(d) is dict and len(d) == 4 else None
    dev = _devices.get(memo)
    if dev is None:
        from .codec import Fields
        from .errors import ArtifactError

        dev = DeviceIdentity.from_json(d, Fields(name, ArtifactError))
        if memo is not None and type(memo[3]) is int:
            _devices[memo] = dev
    return dev


def _artifact_dirs() -> list[_Source]:
    out = []
    for d in filter(None, os.environ.get("FLYTUNE_ARTIFACT_DIR", "").split(os.pathsep)):
        path = Path(d)
        if path.is_dir():
            out.append(_Source(f"FLYTUNE_ARTIFACT_DIR {path}", path))
        else:
            warning.once(("artifact-dir", d), f"FLYTUNE_ARTIFACT_DIR names {d!r}, which is not a directory; ignored")
    return out


def _bundles() -> list[_Source]:
    from importlib.metadata import entry_points

    out = []
    for ep in sorted(entry_points(group=bundle.ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        src = locate(ep)
        if src is not None:
            out.append(src)
    return out


def locate(ep) -> _Source | None:
    """The bundle an entry point names (`<package>._flytune`), read without importing the package."""
    parts = ep.value.split(":")[0].strip().split(".")
    label = f"{ep.dist.name if ep.dist else ep.name} bundle"
    candidates = []
    if ep.dist is not None:
        candidates.append(Path(ep.dist.locate_file("/".join(parts))))
    import importlib.util

    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.append(Path(loc, *parts[1:]))
    for root in candidates:
        manifest = root / bundle.MANIFEST
        if manifest.is_file():
            try:
                return _Source(label, root, bundle.Manifest.from_bytes(manifest.read_bytes(), file=manifest))
            except OSError as e:
                warning.once(("manifest", str(manifest)), f"{manifest}: cannot be read: {e.strerror}; bundle ignored")
            except FlytuneError as e:
                warning.once(("manifest", str(manifest)), f"{e}; bundle ignored, the next tier serves")
            return None
    warning.once(("manifest", ep.value), f"entry point {ep.name} = {ep.value!r} in group "
              f"{bundle.ENTRY_POINT_GROUP}: no {bundle.MANIFEST} found; bundle ignored")
    return None


_devices: dict[tuple, DeviceIdentity] = {}
TIER = OfflineTier()
