"""The tuning driver: one plan over an executor's workers (this process, local processes pinned to
GPUs, or Ray actors across machines), the same rules on every executor.

The driver starts every worker and learns the device each one measured, before any job. The plan
becomes jobs, one per (plan entry, shape) for each distinct device, each written under the output
template's directory for its device (a template that would mix two devices is refused). A job goes
to whichever worker of its device is free; its artifacts are published atomically, with the resume
state, the moment it finishes, so a driver killed at any point resumes without redoing a finished job.

A job that kills its worker (a crash, a signal, a broken GPU context) or runs past `--job-timeout`
fails alone: its worker is replaced and the job retried once, then reported failed. A job whose setup
or call raises fails at once (it would raise again). Either way the rest of the plan completes and
the run exits 1, the summary naming each failed job and why.

A job an earlier run finished is resumed only while what it depended on holds (`fingerprint`: the
kernel's config space and source, the setup, the output check, the toolchain, the ranking); otherwise
it runs again, and its outcome and the report say why (`retuned`). A state an earlier release wrote
holds no fingerprint: its jobs run again, saying so.

Every job carries the run's options and the output's shipped winners for its kernel (`shipped`): repeat,
min_improvement and the keep-or-replace rule run where the job runs, so whether an output keeps its
winners never depends on the executor. The driver prints nothing: what it has to tell goes to the
`Reporter` it is given and into the `Report` it returns.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ..core import fsutil
from ..core.artifact import Artifact
from ..core.device import parse_spec
from ..core.errors import DeviceError, FlytuneError, TuneError, UsageError
from ..core.project import Project, TuneEntry, ships, unshipped_fix
from . import fingerprint, layout
from .shipped import MIN_IMPROVEMENT_PCT, read_output
from .job import Job, check_kernels, check_options, no_search_note
from .ledger import read_state, snapshot
from .publisher import Publisher
from .outcome import Outcome, Report, Slot
from .stability import Stability

START_TIMEOUT = 300.0   # seconds a worker may take to import, start and report its device
ATTEMPTS = 2            # a job that kills its worker runs at most this often
# A worker is handed its next job before it finishes the current one while its device's jobs are
# short (on average under SHORT_JOB seconds): the round trip to the driver, and the driver's
# publishing, then overlap the work. Long jobs go one at a time, so that none waits behind another
# while a worker is idle.
PREFETCH, SHORT_JOB = 2, 0.5


class Refused(UsageError):
    """The run will not go as asked (workers on devices the output template does not separate)."""


@dataclass
class Options:
    executor: str = "inprocess"      # inprocess | local | ray
    workers: int | None = None       # default: one per visible GPU (local), per GPU in the cluster (ray)
    address: str | None = None       # ray: the cluster to join (default: start a local one)
    job_timeout: float | None = None
    resume: bool = True
    ranking: str | None = None
    output: str | None = None        # the output template (default: tool.flytune.tune.output)
    repeat: int = 1                  # searches per shape; the majority winner is written
    min_improvement: float = MIN_IMPROVEMENT_PCT   # percent a config must beat a shipped winner by
    start_timeout: float = START_TIMEOUT


class Reporter:
    """What a run tells while it goes. This one tells nobody: the `Report` holds everything."""

    def start(self, total: int, finished: int) -> None:
        """`total` jobs in the plan, `finished` of them by earlier runs."""

    def working(self, worker: str, what: str | None) -> None:
        """`worker` now runs `what` (None: idle)."""

    def finished(self, line: str, *, failed: bool = False) -> None:
        """One job ended: `line` says how, and on which worker."""

    def note(self, text: str) -> None:
        """A warning or an account of a worker's end."""

    def close(self) -> None:
        pass


class Driver:
    """One run of a plan over an executor's workers; `run()` returns the report."""

    def __init__(self, project: Project, entries: tuple[TuneEntry, ...], options: Options, executor,
                 reporter: Reporter | None = None, fingerprints: dict | None = None):
        self.project, self.entries, self.options, self.executor = project, entries, options, executor
        self.fingerprints = fingerprint.of_plan(project.root, entries) if fingerprints is None else fingerprints
        self.retuned: dict[str, str] = {}  # job id -> why a finished job runs again
        self.reporter = reporter or Reporter()
        self.notes: list[str] = []
        self.slots = [Slot(i, executor.name(i)) for i in range(executor.slots)]
        self.jobs: list[Job] = []
        self.queues: dict[str, deque[Job]] = {}
        self.outcomes: dict[str, list[Outcome]] = {}
        self.attempts: dict[str, list[str]] = {}
        self.failed_as: dict[tuple, Job] = {}   # (kernel, setup, autotuner, reason) -> its first job to fail so
        self.directories: dict[str, Path] = {}
        self.made: set[Path] = set()            # the output directories, and parents, this run made
        self.done: dict[str, dict] = {}
        self.published: dict[Path, Job] = {}
        self.seconds: dict[str, float] = {}     # device spec -> a running mean of its jobs' duration
        self.shipped: dict[str, dict[str, dict[str, bytes]]] = {}   # device spec -> kernel -> file -> bytes
        self.progress: Reporter | None = None
        self.publisher: Publisher | None = None

    def run(self) -> Report:
        begin = time.perf_counter()
        startup = jobs = math.nan
        try:
            for warning in check_kernels(self.project.root, self.entries):  # a misspelled kernel: said once, first
                self.note(warning)
            self._start_all()
            startup = time.perf_counter() - begin
            self._plan()
            self._drive()
            jobs = time.perf_counter() - begin - startup
        finally:
            self.executor.close()
            if self.publisher is not None:
                self.publisher.close()
                self._publish_failures()
            if self.progress is not None:
                self.progress.close()
            for made in sorted(self.made, key=lambda p: -len(p.parts)):
                try:   # what this run made and left empty (every job failed) goes, deepest first
                    os.rmdir(made)
                except OSError:
                    pass   # something is in it: kept
        outcomes = [o for j in self.jobs for o in self.outcomes.get(j.id, ())]
        return Report(outcomes, self.directories, self.slots, self.executor.kind, startup, jobs,
                      time.perf_counter() - begin, self.notes)

    # -- workers -------------------------------------------------------------------------------
    def _start(self, slot: Slot) -> None:
        slot.state, slot.jobs, slot.since = "starting", [], time.monotonic()
        self.executor.start(slot.index)

    def _start_all(self) -> None:
        for slot in self.slots:
            self._start(slot)
        while any(s.state == "starting" for s in self.slots):
            self._step()
        up = sum(s.state == "idle" for s in self.slots)  # each reason said once: the error, or a warning
        if not up:  # what to do is in the reason (a DeviceError says what to set)
            raise TuneError("; ".join(f"the {s.name} worker {s.reason}" for s in self.slots))
        for s in (s for s in self.slots if s.state == "retired"):
            self.note(f"flytune: warning: worker {s.name} {s.reason}; the run goes on with the {up} that started")

    def _retire(self, slot: Slot, reason: str) -> None:
        self.executor.kill(slot.index)
        slot.state, slot.reason, slot.jobs = "retired", reason, []
        if self.directories and any(s.state != "retired" for s in self.slots):  # else `_start_all` or its jobs say it
            self.note(f"flytune: worker {slot.name} stopped ({reason}); the other workers take its jobs")

    def _start_failed(self, slot: Slot, reason: str) -> None:
        self.executor.kill(slot.index)
        slot.start_failures += 1
        if slot.start_failures >= ATTEMPTS:
            self._retire(slot, f"could not start: {reason}")
        else:
            self._start(slot)

    _on_start_failed = _start_failed

    def _on_hello(self, slot: Slot, spec: str, host: str, pid: int) -> None:
        dev = parse_spec(spec, source=f"worker {slot.name}")
        if self.directories and spec not in self.directories:
            self._retire(slot, f"came back on {spec}, a device this run does not tune for")
            return
        slot.device, slot.host, slot.state, slot.start_failures = dev, host, "idle", 0

    # -- the plan --------------------------------------------------------------------------------
    def _plan(self) -> None:
        devices = {s.device for s in self.slots if s.state == "idle"}
        template = self.options.output or str(self.project.tune_dir)
        try:
            directories = layout.check_separates(template, devices)
        except FlytuneError as e:
            raise Refused(e.rule) from None
        finished, found = 0, {}
        for dev, directory in directories.items():
            spec = dev.spec()
            self.made.update(p for p in (Path(directory), *Path(directory).parents) if not os.path.lexists(p))
            fsutil.output_directory(directory)
            if not ships(self.project.root, self.project.sources, directory):
                self.note(unshipped_note(self.project, directory))
            self.directories[spec], self.shipped[spec] = directory, read_output(directory)
            self.done[spec], found[directory] = finished_in(directory, self.options.resume)
            jobs, self.queues[spec], resumed, retuned = lay_out(self.entries, spec, self.done[spec], self.fingerprints,
                                                                self.options.ranking)
            self.retuned.update(retuned)
            self.jobs += jobs
            self.outcomes.update(resumed)
            finished += len(resumed)
        self.progress = self.reporter
        self.progress.start(len(self.jobs), finished)
        self.publisher = Publisher({self.directories[spec]: dict(done) for spec, done in self.done.items()}, found)

    def _drive(self) -> None:
        while True:
            self._dispatch()
            if not any(s.state in ("busy", "starting") for s in self.slots):
                self._orphan()
                if not any(self.queues.values()):
                    return
            self._step()

    def _dispatch(self) -> None:
        """A job for every idle worker first; then, while jobs are short, one ahead for the busy ones."""
        for depth in (1, PREFETCH):
            for slot in self.slots:
                if slot.state not in ("idle", "busy") or (depth > 1 and not self._short(slot.device.spec())):
                    continue
                queue = self.queues.get(slot.device.spec())
                while queue and len(slot.jobs) < depth:
                    job = queue.popleft()
                    if not slot.jobs:
                        slot.since = time.monotonic()
                        self.progress.working(slot.name, job.label())
                    slot.jobs.append(job)
                    slot.state = "busy"
                    self.executor.submit(slot.index, job, job_options(self.options, self.shipped, job))

    def _short(self, spec: str) -> bool:
        return self.seconds.get(spec, SHORT_JOB) < SHORT_JOB

    def _finish(self, slot: Slot) -> Job:
        """The slot's running job ended; the one handed ahead (if any) starts now."""
        job, now = slot.jobs.pop(0), time.monotonic()
        spec = job.device
        self.seconds[spec] = 0.8 * self.seconds.get(spec, now - slot.since) + 0.2 * (now - slot.since)
        slot.since = now
        if slot.jobs:
            self.progress.working(slot.name, slot.jobs[0].label())
        else:
            slot.state = "idle"
            self.progress.working(slot.name, None)
        return job

    def _orphan(self) -> None:
        """Fail the jobs of a device no live worker is left for."""
        for spec, queue in self.queues.items():
            if queue and not any(s.state != "retired" and s.device and s.device.spec() == spec for s in self.slots):
                why = "; ".join(s.reason for s in self.slots if s.reason and s.device and s.device.spec() == spec)
                while queue:
                    self._fail(queue.popleft(), None, f"no worker left for {spec} ({why})")

    def _step(self) -> None:
        """Wait for the next events (or the next deadline) and handle them."""
        now = time.monotonic()
        deadlines = [s.since + self._limit(s) for s in self.slots if self._limit(s) is not None]
        wait = min([0.5] + [d - now for d in deadlines])
        for event in self.executor.poll(max(wait, 0.0)):
            kind, slot = event[0], self.slots[event[1]]
            getattr(self, "_on_" + kind.replace("-", "_"))(slot, *event[2:])
        self._publish_failures()
        now = time.monotonic()
        for slot in self.slots:
            limit = self._limit(slot)
            if limit is not None and now - slot.since > limit:
                if slot.state == "starting":
                    self._start_failed(slot, f"did not report its device within {limit:g} s")
                else:
                    self._lost(slot, f"ran past --job-timeout {limit:g} s")

    def _limit(self, slot: Slot) -> float | None:
        if slot.state == "starting":
            return self.options.start_timeout
        return self.options.job_timeout if slot.state == "busy" else None

    # -- events (and `_on_hello` above) -------------------------------------------------------------
    def _on_died(self, slot, reason):
        if slot.state == "starting":
            self._start_failed(slot, reason)
        elif slot.state == "busy":
            self._lost(slot, reason)
        elif slot.state == "idle":
            self._start(slot)

    def _on_failed(self, slot, jid, reason, fatal):
        if not slot.jobs or slot.jobs[0].id != jid:
            return
        if fatal:
            self._lost(slot, f"{reason} (and left its GPU context broken)")
            return
        self._fail(self._finish(slot), slot, reason)

    def _on_done(self, slot, jid, spec, results):
        if not slot.jobs or slot.jobs[0].id != jid:
            return
        job = self._finish(slot)
        if spec != job.device:
            self._fail(job, slot, f"its worker measured on {spec}, not on {job.device}")
            return
        try:
            outcomes = publish(self, job, slot, results)
        except FlytuneError as e:
            self._fail(job, slot, f"returned an invalid artifact: {e}")
            return
        self.outcomes[job.id] = outcomes
        statuses = ", ".join(sorted({o.status for o in outcomes}))
        self.progress.finished(f"{statuses} {job.label()} on {slot.name}@{slot.host}")

    def _lost(self, slot: Slot, reason: str) -> None:
        """The slot's worker is gone mid-job (or must go): replace it, retry its job once; a job
        handed ahead never started, and goes back as it was."""
        job, ahead = slot.jobs[0], slot.jobs[1:]
        self.executor.kill(slot.index)
        self.progress.working(slot.name, None)
        self._start(slot)
        self.queues[job.device].extendleft(reversed(ahead))
        tries = self.attempts.setdefault(job.id, [])
        tries.append(reason)
        if len(tries) < ATTEMPTS:
            self.queues[job.device].appendleft(job)
            self.note(f"flytune: {job.label()} on {slot.name}@{slot.host}: {reason}; retrying on a fresh worker")
        else:
            same = len(set(tries)) == 1
            self._fail(job, slot, f"{reason} (both attempts)" if same else "; then ".join(tries))

    def _fail(self, job: Job, slot: Slot | None, reason: str) -> None:
        worker, host = (slot.name, slot.host) if slot else ("-", "-")
        first = self.failed_as.setdefault((job.entry.kernel, job.entry.setup, job.entry.autotuner, reason), job)
        reason = reason if first is job else f"the same error as {first.label()}"  # an entry's jobs alike: said once
        self.outcomes[job.id] = [Outcome(job, "failed", worker, host, reason=reason)]
        # the reason is the run's error at its end, and the table's: the progress line names the job alone
        self.progress.finished(f"FAILED {job.label()} on {worker}@{host} (the error is said at the end)", failed=True)

    def _publish_failures(self) -> None:
        for job, reason in self.publisher.take_failures() if self.publisher else ():
            if job is None:   # a state file: each write that fails alike is said once
                if f"flytune: warning: {reason}" not in self.notes:
                    self.note(f"flytune: warning: {reason}")
            else:   # said with the other failures, where the run ends: its progress line said "tuned"
                self.outcomes[job.id] = [Outcome(job, "failed", reason=f"tuned, but {reason}")]

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.reporter.note(text)


def publish(driver: Driver, job: Job, slot: Slot, results) -> list[Outcome]:
    """Hand the job's artifacts to the driver's publisher, which writes them, then records the job done: a
    key another job of this run tuned keeps the first one's artifact; no artifact at all is a no-search."""
    directory, outcomes, files = driver.directories[job.device], [], []
    for outcome, art, data in received(job, slot, results):
        path, outcome.retuned = directory / art.filename, driver.retuned.get(job.id)
        first = driver.published.setdefault(path, job)
        if first is not job:
            outcome.status, outcome.reason, outcome.change = "duplicate", f"same artifact as {first.label()}", "-"
        elif outcome.change != "-" and data is not None:
            files.append((path, data))
            driver.shipped[job.device].setdefault(art.kernel, {})[art.filename] = data
        outcomes.append(outcome)
    if not outcomes:
        driver.note(f"flytune: warning: {no_search_note(job.entry, job.shape)}")
        return [Outcome(job, "no-search", slot.name, slot.host)]
    driver.publisher.publish(job, directory, files, record_of(outcomes[-1], driver.fingerprints))
    return outcomes


def finished_in(directory: Path, resume: bool) -> tuple[dict, dict]:
    """(the jobs a run resumes from `directory`'s state, the state as the run finds it: `write_state`'s base)."""
    if not resume:
        return {}, snapshot(directory)
    done = read_state(directory)
    return done, dict(done)


def unshipped_note(project: Project, directory: Path) -> str:
    fix = unshipped_fix(project.root, project.sources, directory)
    return (f"flytune: warning: {directory} is outside [tool.flytune] sources ({', '.join(project.sources)}): "
            f"the build does not ship what this run writes there: {fix}")


def record_of(last: Outcome, fingerprints: dict | None) -> dict:
    """The job's record in `.flytune-tune-state` (`ledger`): its last winner, and what it depended on."""
    record = {"winner": last.winner, "time_ms": last.time_ms, "margin": last.margin}
    if last.ranking is not None:
        record["ranking"] = last.ranking
    depends = (fingerprints or {}).get(fingerprint.entry_name(last.job.entry))
    if depends is not None:
        record["depends"] = depends
    return record


def job_options(options: Options, shipped: dict, job: Job) -> dict:
    """What travels with a job: the run's options and the output's shipped winners of its kernel."""
    files = shipped[job.device].get(job.entry.kernel, {})
    return {"repeat": options.repeat, "min_improvement": options.min_improvement,
            "winners": {name: data.decode() for name, data in files.items()}, **check_options(job.entry)}


def received(job: Job, slot: Slot, results) -> list[tuple[Outcome, Artifact, bytes | None]]:
    """A worker's results for `job`, checked: (the outcome, the artifact, its bytes if it is to be
    written). Each artifact's name must be its content address and its device the job's."""
    out = []
    for r in results:
        name, data = r["file"], r["artifact"].encode()
        art = Artifact.from_bytes(data, file=name)
        if art.device.spec() != job.device:
            raise DeviceError(f"is for {art.device.spec()}, not {job.device}", file=name, field="device")
        stable = None if r.get("stability") is None else Stability.from_json(r["stability"])
        chosen = (art.provenance or {}).get("selection") or {}
        confidence = chosen.get("confidence")
        ranking = (art.provenance or {}).get("ranking")
        checked = (art.provenance or {}).get("outputs") or {}   # the output check's record (core.choice)
        wrong = checked.get("rejected") if isinstance(checked, dict) else None
        note = checked.get("note") if isinstance(checked, dict) else None
        cands = (art.provenance or {}).get("candidates") or ()
        failed = sum(1 for c in cands if isinstance(c, dict) and c.get("error")
                     and not str(c["error"]).startswith("WrongOutput"))
        out.append((Outcome(job, "tuned", slot.name, slot.host, dict(art.key), r["winner"], r["time_ms"], r["margin"],
                            change=r["change"], stable=stable,
                            confidence=float(confidence) if isinstance(confidence, (int, float)) else None,
                            resolved=chosen.get("resolved") if isinstance(chosen.get("resolved"), bool) else None,
                            ranking=ranking if isinstance(ranking, str) else None, wrong=(wrong if isinstance(wrong, int) else 0, len(cands)),
                            unchecked=note if isinstance(note, str) else None, failed_candidates=failed),
                    art, data if r["write"] else None))
    return out


def lay_out(entries: tuple[TuneEntry, ...], spec: str, done: dict, fingerprints: dict | None = None, ranking=None):
    """The plan's jobs for one device: (all of them, those to run, {job id: outcome} of those done and
    still holding, {job id: why} of those done whose inputs moved since or ranked otherwise than the run's
    `ranking`, which run again: their records leave `done`, so the state never names a job whose inputs
    moved). Without `fingerprints` a finished job holds while its ranking does (`fingerprint.again`)."""
    jobs, pending, resumed, retuned = [], deque(), {}, {}
    for entry in entries:
        for shape in entry.shapes:
            job = Job(entry, shape, spec)
            jobs.append(job)
            record = done.get(job.id)
            why = None if record is None else fingerprint.again(record, ranking, fingerprints, entry)
            if record is None or why is not None:
                pending.append(job)
                if why is not None:
                    retuned[job.id] = why
                    del done[job.id]
            else:
                resumed[job.id] = [Outcome(job, "resumed", winner=record["winner"], time_ms=record["time_ms"],
                                           margin=record.get("margin"), ranking=record.get("ranking"))]
    return jobs, pending, resumed, retuned
