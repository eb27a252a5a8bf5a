"""`flytune tune --repeat K`: each shape searched K times in a row, to see which winners are unstable
before they ship.

Every repetition is a whole search, as one `flytune tune` would make it (the shipped winner's
hysteresis included); the kernel forgets its decisions between repetitions. The artifact written is
the majority winner's: the config chosen most often (on a tie in count, the earliest declared), with
the provenance of the last repetition that chose it and `selection.stability = {"runs": K, "agreed":
n}`. Each key's Stability gives how many of the K agreed and the spread: how far the written config's
own time moved between repetitions, (max - min) / min (the table `tune --repeat` prints is cli.render's).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..core.project import TuneEntry
from ..runtime.serving import autotuner
from . import job


@dataclass(frozen=True)
class Stability:
    runs: int
    agreed: int
    spread: float | None       # (max - min) / min of the written config's time over the runs
    others: tuple[tuple[str, int], ...]   # the other winners and how often each won

    @property
    def label(self) -> str:
        return f"{self.agreed}/{self.runs}"

    def to_json(self) -> dict:
        return {"runs": self.runs, "agreed": self.agreed, "spread": self.spread,
                "others": [[c, n] for c, n in self.others]}

    @classmethod
    def from_json(cls, d: dict) -> Stability:
        """The worker's own `to_json` (data from a worker, never executed)."""
        return cls(int(d["runs"]), int(d["agreed"]), None if d.get("spread") is None else float(d["spread"]),
                   tuple((str(c), int(n)) for c, n in d.get("others") or ()))


def run(root: Path, entry: TuneEntry, shape: dict, repeat: int) -> list[tuple[job.Tuned, Stability | None]]:
    """`job.run` `repeat` times; each searched key's majority winner with its stability."""
    kernel = autotuner.kernel(entry.kernel)
    if kernel is not None:  # a job searches whatever this process decided before (an earlier run, a job)
        kernel.reset()
    runs = [job.run(root, entry, shape)]
    kernel = autotuner.kernel(entry.kernel)
    if repeat <= 1 or entry.autotuner or kernel is None or not runs[0]:  # a @triton.autotune recording: once
        return [(t, None) for t in runs[0]]
    for _ in range(repeat - 1):
        kernel.reset()  # forget the decision: the next call searches again
        runs.append(job.run(root, entry, shape))
    by_identity: dict[str, list[job.Tuned]] = {}
    for tuned in runs:
        for t in tuned:
            by_identity.setdefault(t.artifact.filename, []).append(t)
    return [majority(ts) for ts in by_identity.values()]


def majority(tuned: list[job.Tuned]) -> tuple[job.Tuned, Stability]:
    """The most frequent winner among repetitions of one key (on a tie, the earliest declared)."""
    counts = Counter(t.artifact.config for t in tuned)
    order = _declared(tuned[-1])
    best = max(counts, key=lambda c: (counts[c], -order.get(c.canonical(), len(order))))
    last = [t for t in tuned if t.artifact.config == best][-1]
    times = [_time_of(t, best) for t in tuned]
    times = [x for x in times if x is not None]
    spread = (max(times) - min(times)) / min(times) if times and min(times) > 0 else None
    prov = dict(last.artifact.provenance or {})
    if isinstance(prov.get("selection"), dict):
        prov["selection"] = {**prov["selection"], "stability": {"runs": len(tuned), "agreed": counts[best]}}
    art = last.artifact.with_provenance(prov)
    others = tuple((str(c), n) for c, n in counts.most_common() if c != best)
    return job.Tuned(art, last.winner, last.time_ms, last.margin), Stability(len(tuned), counts[best], spread, others)


def _declared(t: job.Tuned) -> dict[bytes, int]:
    from ..core import codec

    cands = (t.artifact.provenance or {}).get("candidates") or []
    return {codec.canonical(c["config"]): i for i, c in reversed(list(enumerate(cands)))}


def _time_of(t: job.Tuned, config) -> float | None:
    from ..core import serving

    return serving.config_time(t.artifact.provenance, config.to_json())

