"""What `flytune inspect` and `flytune diff` report, as data: a source's coverage (kernels x targets),
key axes, toolchain and sizes; two sources' added, removed and changed winners; and which installed
bundle serves each kernel on this device (`inspect --installed`). The CLI renders them (cli.render)."""
from __future__ import annotations

from ..core import artifactdir, serving, verification
from ..core.artifact import Artifact
from ..core.target import Target
from .source import Source


def inspect(src: Source) -> dict:
    targets = list(src.targets) or sorted({Target(a.device.arch) for a in src.artifacts}, key=lambda t: t.label())
    kernels = sorted({a.kernel for a in src.artifacts})
    matrix = {k: {t.label(): sum(1 for a in src.artifacts if a.kernel == k and t.covers(a.device))
                  for t in targets} for k in kernels}
    axes = {k: sorted({ax for a in src.artifacts if a.kernel == k for ax in a.key_axes()}) for k in kernels}
    tuned = sorted({(a.provenance or {}).get("triton") for a in src.artifacts} - {None})
    # a bundle's sizes are its shards' and files' as read; a project's (or an sdist's) artifacts are read
    # canonical, so each file is its canonical bytes: measured here, never reported as 0
    measured = [] if src.sizes else [(a.filename, len(a.to_bytes())) for a in src.artifacts]
    sizes, total = src.sizes or dict(measured), sum(src.sizes.values()) + sum(n for _, n in measured)
    return {"path": src.path, "kind": src.kind, "ok": src.ok, "package": src.manifest.package if src.manifest else None,
            "targets": [{"label": t.label(), "accept": list(t.accept)} for t in targets],
            "coverage": matrix, "key_axes": axes,
            "toolchain": {"declared": src.manifest.triton if src.manifest else None, "tuned_with_triton": tuned},
            "artifacts": len(src.artifacts), "bytes": total, "sizes": dict(sorted(sizes.items())),
            "errors": [e.to_json() for e in src.errors]}


def diff(old: Source, new: Source) -> dict:
    """Winners added, removed and changed from `old` to `new`, by identity (kernel, key, device); a key
    an earlier release wrote without its null axes is the key with them (`verification.conform`, read
    over both sources), as the runtime serves it."""
    nullable = verification.nullable_axes([*old.artifacts, *new.artifacts])
    a = {x.address: x for x in (verification.conform(y, nullable.get(y.kernel)) for y in old.artifacts)}
    b = {x.address: x for x in (verification.conform(y, nullable.get(y.kernel)) for y in new.artifacts)}

    def ident(x: Artifact) -> dict:
        return {"kernel": x.kernel, "key": dict(x.key), "device": x.device.spec()}

    changed = []
    for addr in sorted(a.keys() & b.keys()):
        if a[addr].config != b[addr].config:
            changed.append({**ident(b[addr]), "old": str(a[addr].config), "new": str(b[addr].config),
                            "margin": _margin(b[addr], a[addr].config)})
    def order(x: dict):  # by kernel, key and device, as people read a diff; not by content address
        return x["kernel"], sorted((k, str(v)) for k, v in x["key"].items()), x["device"]

    return {"added": sorted((ident(b[x]) for x in b.keys() - a.keys()), key=order),
            "removed": sorted((ident(a[x]) for x in a.keys() - b.keys()), key=order),
            "changed": sorted(changed, key=order), "unchanged": sum(1 for x in a.keys() & b.keys() if a[x].config == b[x].config),
            "errors": [e.to_json() for e in old.errors + new.errors]}


def _margin(new: Artifact, old_config) -> float | None:
    """How much slower the old winner was, in the new tuning run's own measurements."""
    t_new = serving.config_time(new.provenance, new.config.to_json())
    t_old = serving.config_time(new.provenance, old_config.to_json())
    if t_new and t_old:
        return t_old / t_new - 1
    return None


def installed(dev=None) -> dict:
    """Which installed bundle (or FLYTUNE_ARTIFACT_DIR directory) serves each kernel on `dev` (default:
    this device), by the runtime's own rules (runtime.serving.offline, core.serving): per kernel its owner
    package, every source holding artifacts for it with its role (directory, owner, pack, or a pack
    not accepted, ignored) and how many of the kernel's keys it serves here. Reads what is installed
    now through a tier of its own: the process's offline tier is left as it is."""
    from ..core import settings
    from ..runtime import device
    from ..runtime.serving.offline import OfflineTier

    dev = dev or device.current()
    tier = OfflineTier()
    sources = tier.sources()
    axes: dict[str, tuple[str, ...]] = {}
    for src in sources:
        if src.manifest is not None:
            for k, info in src.manifest.kernels.items():
                axes.setdefault(k, tuple(info.axes))
        else:
            for path in artifactdir.listing(src.root):
                kernel = path.name.rsplit("-", 1)[0]
                if kernel not in axes:
                    doc = next(tier.documents(src, kernel), None)
                    if doc is not None:
                        axes[kernel] = tuple(sorted(doc[0]["key"]))
    kernels = []
    for k in sorted(axes):
        owner = serving.owner(k, [s.package for s in sources if s.package is not None])
        ranked = {id(s): r for r, s in tier.ranked(k)}
        idx = tier.index(k, axes[k], dev)
        served: dict[str, int] = {}
        for hit in idx.hits.values():
            served[hit.origin] = served.get(hit.origin, 0) + 1
        rows = []
        for src in sources:
            holds = (src.manifest is None and any(True for _ in tier.documents(src, k))) or (
                src.manifest is not None and k in src.manifest.kernels)
            if not holds:
                continue
            r = ranked.get(id(src))
            role = ("directory" if src.manifest is None else "owner" if r is not None and r[0] == serving.OWNER
                    else "pack" if r is not None else "pack, not accepted")
            keys = (sum(n for o, n in served.items() if o.startswith(str(src.root))) if src.manifest is None
                    else served.get(src.label, 0)) if r is not None else 0
            rows.append({"source": src.label, "dist": src.dist, "role": role, "keys_served": keys})
        kernels.append({"kernel": k, "owner": owner, "keys": len(idx), "sources": rows,
                        "problems": list(idx.problems)})
    return {"device": dev.spec(), "packs_setting": list(settings.current().packs), "kernels": kernels}
