"""The offline tier: one kernel's index of the artifacts installed bundles and FLYTUNE_ARTIFACT_DIR
directories hold for the running device.

What is installed, and who owns what, is core.installed's (found once per process here); each
kernel's shard is read, hash-checked and indexed on that kernel's first call, and never again. For a
kernel its owner does not own, a bundle is a config pack, served only where the owner accepts it
(`[tool.flytune] packs`, carried in its manifest) or the user opts in (FLYTUNE_PACKS), and only for
keys the owner lacks (`Hit.pack` names it). Under FLYTUNE_AUTOTUNE=bundle (the proof that installed
bundles serve) FLYTUNE_ARTIFACT_DIR directories are not read, and `explain` says why a kernel's key is
not served by any installed bundle.
"""
from __future__ import annotations

import operator
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple

from ...core import bundle, codec, installed, serving, settings
from ...core.artifact import Artifact
from ...core.device import DeviceIdentity
from ...core.errors import ArtifactError, FlytuneError
from .. import warning


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


class Slot:
    """One kernel's offline index, built on first use and kept until `clear`. Of builds made at once, one
    is kept (`dict.setdefault`: one step under the GIL) and only its problems are reported; a build a
    `clear` overtook (settings re-read meanwhile: `reset_stats`) serves its own call and is not kept."""
    __slots__ = ("_built", "_clears", "_index")

    def __init__(self):
        self._index, self._built, self._clears = None, {}, 0

    def clear(self) -> None:
        self._clears += 1
        self._built = {}
        self._index = None

    def get(self, build, report) -> Index:
        index = self._index
        if index is not None:
            return index
        clears, built = self._clears, self._built
        index = build()
        kept = built.setdefault(clears, index)
        if kept is index:
            report(index)
        if clears == self._clears:
            self._index = kept
        return kept


class _Rows(NamedTuple):
    """What the rows of one shard served at one level share."""
    shard: bundle.Shard
    level: str
    label: str
    pack: str | None


class OfflineTier:
    """The process's offline tier: the installed sources (core.installed), found once, and each
    kernel's index for the running device. A tool that must not disturb the process's tier (`inspect
    --installed`) makes an `OfflineTier()` of its own."""

    def __init__(self):
        self._sources: list[installed.Source] | None = None
        self._dir_files: dict[Path, list[Path]] = {}

    def reset(self) -> None:
        self._sources = None
        self._dir_files = {}

    def sources(self) -> list[installed.Source]:
        if self._sources is None:
            self._sources = installed.discover(warning.once)
        return self._sources

    def ranked(self, kernel: str) -> list[tuple[tuple, installed.Source]]:
        """The sources that may serve `kernel`, each with its rank (core.serving: the user's artifact
        directories, then the owner's bundle, then the config packs accepted for it), in order."""
        sources = self.sources()
        owner = serving.owner(kernel, [s.package for s in sources if s.package is not None])
        accepted = {p for s in sources if owner is not None and s.package == owner for p in s.manifest.packs}
        bundles_only = settings.current().autotune == "bundle"
        out = []
        for order, src in enumerate(sources):
            if src.manifest is None:
                if bundles_only:
                    warning.once(("bundle-mode", src.label), f"{src.label}: not read under FLYTUNE_AUTOTUNE=bundle, "
                                 f"which proves what installed bundles serve")
                    continue
                out.append(((serving.USER, order), src))
            elif owner is not None and src.package == owner:
                out.append(((serving.OWNER, order), src))
            elif kernel in src.manifest.kernels:
                if serving.pack_accepted(src.dist or "", accepted, settings.current().packs):
                    out.append(((serving.PACK, order), src))
                elif not (src.refused and serving.under(kernel, src.manifest.package)):  # else said: why it owns none
                    warning.once(("pack", src.label, kernel), f"{src.label}: holds artifacts for {kernel}, which it "
                                 f"does not own ({owner or 'no installed bundle'} does): a config pack, not accepted "
                                 f"by the owner's [tool.flytune] packs nor FLYTUNE_PACKS; ignored")
        return out

    def explain(self, kernel: str, device: DeviceIdentity) -> str:
        """Why no installed bundle serves a key of `kernel` on `device` (FLYTUNE_AUTOTUNE=bundle's
        TierMissError): each bundle holding the kernel that serves none of it, and why; for each that
        serves it, the devices it holds it for and how many keys it serves here."""
        sources = self.sources()
        ranked = {id(src) for _, src in self.ranked(kernel)}
        said = []
        for src in sources:
            if src.manifest is None or kernel not in src.manifest.kernels:
                continue
            if id(src) not in ranked:
                said.append(f"{src.label} holds it but serves none of it: " + (
                    f"the distribution does not own package {src.manifest.package}: {src.refused}" if src.refused
                    else "a config pack that neither its owner's [tool.flytune] packs nor FLYTUNE_PACKS accept"))
                continue
            try:
                shard = src.shard(kernel)
                levels = [src.served_level(installed.device_of(d, src.label), device) for d in shard.devices]
            except FlytuneError as e:
                said.append(f"{src.label}: {e}")
                continue
            keys = sum(1 for row in shard.rows if levels[row[0]] is not None)
            if keys:
                said.append(f"{src.label} serves {keys} tuned key(s) of it on {device}, not this one")
            else:
                others = sorted({not_served(installed.device_of(d, src.label), device) for d in shard.devices})
                said.append(f"{src.label} holds it for {', '.join(others) or 'no device'} only")
        if not said:
            owner = serving.owner(kernel, [s.package for s in sources if s.package is not None])
            said.append("no installed bundle holds artifacts for it" +
                        (f" (its package {owner}'s bundle holds none)" if owner is not None else ""))
        if settings.current().artifact_dirs:
            said.append("FLYTUNE_ARTIFACT_DIR is not read under FLYTUNE_AUTOTUNE=bundle")
        return "; ".join(said)

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

    def _shard_groups(self, src: installed.Source, kernel: str, axes: tuple[str, ...], device: DeviceIdentity,
                      idx: Index, pack: str | None = None):
        try:
            shard = src.shard(kernel)
        except FlytuneError as e:
            idx.problems.append(f"{e} (shard refused)")
            return
        if shard is None:
            return
        if sorted(shard.axes) != sorted(axes):
            idx.problems.append(str(_axes_error(shard.axes, axes, f"{src.label}: {kernel}")))
            return
        levels = []  # per device of the shard (a shard holds few): the level it is served at, or None
        for d in shard.devices:
            try:
                dev = installed.device_of(d, src.label)
            except FlytuneError as e:
                idx.problems.append(str(e))
                levels.append(None)
                continue
            levels.append(_served_level(src, dev, device, idx))
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

    def _dir_groups(self, src: installed.Source, kernel: str, axes: tuple[str, ...], device: DeviceIdentity,
                    idx: Index):
        levels: dict[DeviceIdentity, str | None] = {}
        axis_set = set(axes)
        found: dict[str, dict[tuple, Hit]] = {}
        first_device: dict[tuple, DeviceIdentity] = {}   # (level, key) -> the device of its first file
        clashes: dict[tuple, list[str]] = {}   # (level, key) -> the files of one identity with other configs
        for doc, dev, origin, name in self.documents(src, kernel, idx):
            key = doc["key"]
            if key.keys() != axis_set:
                idx.problems.append(str(_axes_error(key, axes, name)))
                continue
            if dev not in levels:
                levels[dev] = _served_level(src, dev, device, idx)
            level = levels[dev]
            if level is not None:
                hits, at = found.setdefault(level, {}), tuple([key[a] for a in axes])
                first = hits.setdefault(at, Hit(doc["config"], level, origin, doc, name))
                if first.source is doc:
                    first_device[level, at] = dev
                elif first_device[level, at] == dev and codec.canonical(first.config) != codec.canonical(doc["config"]):
                    clashes.setdefault((level, at), [first.name]).append(name)   # `n = 100` and `n = 100.0`: one key
        for (level, at), names in clashes.items():
            del found[level][at]
            idx.problems.append(serving.conflict(names, dict(zip(axes, at))))
        for level, hits in found.items():   # within a group, the first file wins (core.serving.best)
            yield level, list(hits), list(hits.values())

    def kernels(self, src: installed.Source) -> list[str]:
        """The kernel names `src` holds artifacts for (a directory's, from its file names)."""
        if src.manifest is not None:
            return sorted(src.manifest.kernels)
        files = self._dir_files.get(src.root)
        if files is None:
            list(self.documents(src, ""))  # lists the directory once, as documents() does
            files = self._dir_files.get(src.root, [])
        return sorted({path.name.rsplit("-", 1)[0] for path in files})

    def documents(self, src: installed.Source, kernel: str, idx: Index | None = None):
        """core.installed.documents, a directory listed once per process; why an unreadable artifact
        was skipped goes to `idx.problems`."""
        idx = Index() if idx is None else idx
        return installed.documents(src, kernel, idx.problems, self._dir_files)


SHOWN = 3  # problems named in full; the rest are counted (10,000 bad files are one warning, not 10,000)


def summarise(problems: list[str]) -> list[str]:
    """At most one line per problem for a few; for more, one line with the count and the first few."""
    if len(problems) <= SHOWN:
        return problems
    return [f"{len(problems)} artifact files or entries ignored; the first {SHOWN}: " + "; ".join(problems[:SHOWN])]


def _served_level(src: installed.Source, dev: DeviceIdentity, running: DeviceIdentity, idx: Index) -> str | None:
    level = src.served_level(dev, running)
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


TIER = OfflineTier()
