"""Where a source's winners were measured: its artifacts grouped by device and toolchain (flytune,
Triton, torch, CUDA or HIP, ranking, timer), each group with its kernels and when it was tuned.

An artifact without provenance (an older release, a hand-written one) forms a group whose fields
read "?"; one group per distinct combination, so a bundle tuned with two Tritons shows two rows.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.artifact import TOOLS, Artifact

FIELDS = ("flytune", *TOOLS, "ranking")


@dataclass(frozen=True)
class Group:
    device: str
    fields: tuple[tuple[str, str], ...]   # (name, value) in FIELDS order, then the timer
    artifacts: int
    kernels: tuple[str, ...]
    created: tuple[str, str] | None       # the first and the last `provenance.created`
    hosts: tuple[str, ...]


def groups(artifacts: list[Artifact]) -> list[Group]:
    by = defaultdict(list)
    for a in artifacts:
        prov = a.provenance or {}
        values = tuple((name, _text(prov.get(name))) for name in FIELDS)
        m = prov.get("measurement")
        timer = _text(m.get("timer")) if isinstance(m, Mapping) else "?"
        by[a.device.spec(), values + (("timer", timer),)].append(a)
    out = []
    for (device, fields), arts in sorted(by.items()):
        created = sorted(p["created"] for p in (a.provenance or {} for a in arts)
                         if isinstance(p.get("created"), str))
        hosts = sorted({p[n] for p in (a.provenance or {} for a in arts) for n in ("host", "worker")
                        if isinstance(p.get(n), str)})
        out.append(Group(device, fields, len(arts), tuple(sorted({a.kernel for a in arts})),
                         (created[0], created[-1]) if created else None, tuple(hosts)))
    return out


def _text(value) -> str:
    return value if isinstance(value, str) else "?" if value is None else str(value)
