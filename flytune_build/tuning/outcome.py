"""How a tuning run ended: each job's `Outcome` (per artifact it produced), the worker `Slot`s, and the
`Report` `tune()` returns (data only: the CLI lays it out)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..core.device import DeviceIdentity
from .job import Job
from .stability import Stability


@dataclass
class Outcome:
    """How one job ended, per artifact it produced (a job with none has one outcome)."""
    job: Job
    status: str                      # tuned | resumed | no-search | duplicate | failed
    worker: str = "-"
    host: str = "-"
    key: dict | None = None
    winner: str = "-"
    time_ms: float = math.nan
    margin: float | None = None
    reason: str | None = None
    change: str = "-"                # new | kept | replaced (+gain%): against the output's shipped winner
    stable: Stability | None = None  # with repeat > 1: how many searches agreed
    confidence: float | None = None  # provenance.selection.confidence: how sure the choice is (0.5-1)
    resolved: bool | None = None     # provenance.selection.resolved: every deciding test settled
    ranking: str | None = None       # provenance.ranking: `synthetic` times are ranks, not milliseconds
    retuned: str | None = None       # why a job an earlier run finished ran again (`fingerprint.changed`)
    wrong: tuple[int, int] = (0, 0)  # (candidates the output check refused, candidates): said with the table
    unchecked: str | None = None     # provenance.outputs.note: what of the outputs was not checked, and why
    failed_candidates: int = 0       # candidates that failed otherwise (a launch, a compile): said with the table

    def to_json(self) -> dict:
        j = self.job
        return {"kernel": j.entry.kernel, "shape": j.shape, "device": j.device, "status": self.status,
                "key": self.key, "winner": self.winner, "time_ms": _number(self.time_ms), "margin": self.margin,
                "change": self.change, "stability": None if self.stable is None else self.stable.to_json(),
                "confidence": self.confidence, "resolved": self.resolved, "worker": self.worker, "host": self.host,
                "reason": self.reason, "ranking": self.ranking, "retuned": self.retuned,
                "wrong_outputs": self.wrong[0], "failed_candidates": self.failed_candidates,
                "outputs_note": self.unchecked}


def _number(x: float | None) -> float | None:
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


@dataclass
class Slot:
    index: int
    name: str
    state: str = "starting"          # starting | idle | busy | retired
    device: DeviceIdentity | None = None
    host: str = "-"
    jobs: list[Job] = field(default_factory=list)   # the job it runs, then the one handed ahead
    since: float = 0.0                               # when it started the first of `jobs`
    start_failures: int = 0
    reason: str | None = None        # why it was retired


@dataclass
class Report:
    outcomes: list[Outcome]
    directories: dict[str, Path]     # device spec -> output directory
    slots: list[Slot]
    executor: str
    startup_s: float                 # until every worker reported its device
    jobs_s: float                    # from then until the last job ended (the workers still up)
    elapsed_s: float                 # all of it, the workers' shutdown included
    notes: list[str] = field(default_factory=list)   # warnings and workers' ends, as the reporter got them
    logs: Path | None = None         # local workers' logs, kept when a job failed

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def to_json(self) -> dict:
        return {"ok": self.ok, "executor": self.executor, "outcomes": [o.to_json() for o in self.outcomes],
                "changes": self.changes(), "directories": {k: str(v) for k, v in self.directories.items()},
                "elapsed_s": self.elapsed_s, "notes": list(self.notes)}

    def retuned(self) -> dict[str, int]:
        """Jobs an earlier run finished that ran again, by why (`fingerprint.changed`)."""
        return _counted(o.retuned for o in {id(o.job): o for o in self.outcomes if o.retuned}.values())

    def changes(self) -> dict[str, int]:
        """How many tuned outcomes were new, kept and replaced against the output's shipped winners."""
        tuned = [o for o in self.outcomes if o.status == "tuned"]
        return {c: sum(o.change.startswith(c) for o in tuned) for c in ("new", "kept", "replaced")}


def _counted(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out
