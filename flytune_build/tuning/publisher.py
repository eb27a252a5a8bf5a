"""Publishing a fleet's results: each finished job's artifacts, then its directory's resume state.

The writes happen on a thread of their own, in the order the jobs finished, so the driver goes on
handing out jobs while the disk syncs; whatever is waiting when several jobs finish at once shares
one write of the state. Every write is atomic (`atomic_write`), and the state names a job only once
its artifacts are in place: a run killed at any moment redoes at most the jobs not yet recorded.
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path

from ..core.errors import FlytuneError
from ..core.fsutil import atomic_write
from .job import Job
from .ledger import write_state


class Publisher:
    def __init__(self, done: dict[Path, dict], bases: dict[Path, dict] | None = None):
        self.done = done                     # directory -> {job id: record}, as the state holds it
        self.bases = bases or {}             # directory -> the state as the run found it (`resume.snapshot`)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failures: list[tuple[Job | None, str]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="flytune-publisher", daemon=True)
        self.thread.start()

    def publish(self, job: Job, directory: Path, files: list[tuple[Path, bytes]], record: dict) -> None:
        """Write `files`, then record `job` as done in `directory`'s state."""
        self.queue.put((job, directory, files, record))

    def take_failures(self) -> list[tuple[Job | None, str]]:
        """The writes that failed since the last call: (the job, or None for a state file; why)."""
        with self.lock:
            out, self.failures = self.failures, []
        return out

    def close(self) -> None:
        """Finish every write handed over, then stop."""
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get())
            touched = []
            for item in batch:
                if item is not None and self._write(*item) and item[1] not in touched:
                    touched.append(item[1])
            for directory in touched:
                try:
                    write_state(directory, self.done[directory], self.bases.get(directory))
                except (OSError, FlytuneError) as e:
                    self._failed(None, f"the resume state in {directory} could not be written: {e}")
            if None in batch:
                return

    def _write(self, job: Job, directory: Path, files, record) -> bool:
        try:
            for path, data in files:
                atomic_write(path, data)
        except OSError as e:
            self._failed(job, f"its artifact could not be written: {e}")
            return False
        self.done.setdefault(directory, {})[job.id] = record
        return True

    def _failed(self, job: Job | None, reason: str) -> None:
        with self.lock:
            self.failures.append((job, reason))
