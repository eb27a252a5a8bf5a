"""Two sources side by side: the winners that changed and by how much (audit.inspection.diff), and the
shapes added or removed.

"By how much" is read two ways. The margin is the old winner's time over the new winner's in the
new run's own candidates (the same process, the same placements: the figure to trust). The
cross-run ratio compares each winner's time as its own run recorded it, which also moves with the
machine, the driver and the load; it is shown only beside the margin, labelled as such. A synthetic
ranking's numbers are ranks: its margin is labelled a rank, and no cross-run ratio is drawn from one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..audit import inspection as audit
from ..core import codec
from ..core.artifact import Artifact
from . import shape
from .shape import key_text, label


@dataclass(frozen=True)
class Change:
    kernel: str
    key: str
    device: str
    old: str
    new: str
    margin: float | None       # old winner / new winner - 1, in the new run (audit.inspection.diff)
    cross_run: float | None    # the new winner's time in its run / the old winner's in its own, - 1
    address: str
    ranks: str | None = None   # "new", "old" or "both": the run(s) whose numbers are synthetic ranks, not times


@dataclass(frozen=True)
class Comparison:
    changed: tuple[Change, ...]
    added: tuple[str, ...]     # "kernel key on device"
    removed: tuple[str, ...]
    unchanged: int
    previous: dict             # new artifact's address -> the old source's winner (a Config)


def compare(old: audit.Source, new: audit.Source) -> Comparison:
    d = audit.diff(old, new)
    a = {x.address: x for x in old.artifacts}
    b = {x.address: x for x in new.artifacts}
    changed = []
    margins = {(c["kernel"], codec.canonical(c["key"]), c["device"]): c["margin"] for c in d["changed"]}
    for addr in sorted(a.keys() & b.keys(), key=lambda x: (b[x].kernel, key_text(b[x].key), x)):
        o, n = a[addr], b[addr]
        if o.config == n.config:
            continue
        margin = margins.get((n.kernel, codec.canonical(dict(n.key)), n.device.spec()))
        ranks = {"new": shape.synthetic(n), "old": shape.synthetic(o)}
        ranked = "both" if all(ranks.values()) else next((k for k, v in ranks.items() if v), None)
        changed.append(Change(n.kernel, key_text(n.key), n.device.spec(), label(o.config), label(n.config),
                              margin, None if ranked else _cross_run(o, n), addr, ranked))
    return Comparison(tuple(changed), tuple(_ident(b[x]) for x in sorted(b.keys() - a.keys())),
                      tuple(_ident(a[x]) for x in sorted(a.keys() - b.keys())), d["unchanged"],
                      {c.address: a[c.address].config for c in changed})


def _cross_run(old: Artifact, new: Artifact) -> float | None:
    t_old, t_new = _own_time(old), _own_time(new)
    ratio = t_new / t_old if t_old and t_new else None
    return ratio - 1 if ratio is not None and math.isfinite(ratio * 100) else None  # inf: t_old a subnormal


def _own_time(art: Artifact) -> float | None:
    """The winner's time in its own run's candidates, where recorded."""
    win = shape.read(art).winner
    return win.time_ms if win is not None and win.time_ms else None


def _ident(a: Artifact) -> str:
    return f"{a.kernel} {key_text(a.key)} on {a.device.spec()}"
