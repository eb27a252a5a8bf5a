"""`<output>/.flytune-tune-state`: the jobs an output directory has finished, so a run resumes.

`{"format": 1, "done": {job id: {"winner", "time_ms", "margin", "ranking", "depends"}}}`, rewritten
atomically after each job whose artifacts are already in place: a run killed at any moment redoes at
most the jobs it had not recorded. `depends` is what the job depended on (`fingerprint`): a job is
resumed only while it holds, and only by a run of the `ranking` it was tuned with (`fingerprint.again`).
`ranking` and `depends` are optional: a state an earlier release wrote has neither, and loads (its jobs
run again, `fingerprint.UNKNOWN`).

What is written is bounded by what is read: one cap, MAX_STATE_BYTES, for both; a record's winner is
cut to WINNER_MAX characters, and a state that would still be over the cap is not written (the one
there stays), an OutputError saying so.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..core import codec
from ..core.codec import Fields
from ..core.errors import OutputError, ProjectError
from ..core.fsutil import atomic_write, read_regular

STATE_FILE = ".flytune-tune-state"
MAX_STATE_BYTES = 64 << 20   # the most a state file may hold, read or written
WINNER_MAX = 4096            # characters of a record's winner (its config, as text)


def read_state(directory: Path) -> dict:
    """The finished jobs recorded in `directory`; none when there is no state file. A state file that
    is there but unreadable or malformed (a FIFO, over the cap, not JSON, a record without its fields)
    is a ProjectError naming the file and the field: delete it, or pass --no-resume."""
    path = Path(directory) / STATE_FILE
    if not os.path.lexists(path):
        return {}
    f = Fields(path, ProjectError)
    try:
        doc = codec.loads(read_regular(path, ProjectError, MAX_STATE_BYTES), file=path, error=ProjectError,
                          max_bytes=MAX_STATE_BYTES)
        f.table(doc, "", ("format", "done"))
        if doc["format"] != 1 or isinstance(doc["format"], bool):
            f.fail("format", f"is {doc['format']!r}; this flytune reads tune state format 1")
        for job, record in f.mapping(doc["done"], "done").items():
            f.table(record, f"done.{job}", ("winner", "time_ms"), ("margin", "ranking", "depends"))
            f.string(record["winner"], f"done.{job}.winner", max_len=WINNER_MAX)
            f.number(record["time_ms"], f"done.{job}.time_ms", nullable=True)
            f.number(record.get("margin"), f"done.{job}.margin", nullable=True)
            if record.get("ranking") is not None:
                f.string(record["ranking"], f"done.{job}.ranking", max_len=64)
            if record.get("depends") is not None:
                for part, value in f.mapping(record["depends"], f"done.{job}.depends").items():
                    f.string(value, f"done.{job}.depends.{part}", max_len=64)
    except ProjectError as e:
        raise ProjectError(f"{e.rule} (a malformed tune state: delete it, or pass --no-resume)", file=path,
                           field=e.field) from None
    return doc["done"]


def snapshot(directory: Path) -> dict:
    """The state as a run finds it at its start (its `base` for `write_state`); a malformed one, none."""
    try:
        return read_state(directory)
    except ProjectError:
        return {}


def write_state(directory: Path, done: dict, base: dict | None = None) -> None:
    """Record `done`, this run's view. With `base` (the state as this run found it, `snapshot`), the
    records another run writing into the same directory has added or changed since are kept too,
    merged under a lock on the directory itself (no lock file among the artifacts): two runs into one
    output redo nothing either finished, and a `--no-resume` run (an empty `done`) still drops what it
    set out to redo."""
    with _locked(Path(directory)):
        merged = dict(done)
        if base is not None:
            now = snapshot(directory)
            merged = {**{job: r for job, r in now.items() if base.get(job) != r}, **done}
        merged = {job: {**r, "winner": str(r["winner"])[:WINNER_MAX]} for job, r in merged.items()}
        data = codec.canonical({"format": 1, "done": merged}) + b"\n"
        if len(data) > MAX_STATE_BYTES:
            raise OutputError(f"would hold {len(data)} bytes, over the {MAX_STATE_BYTES} this flytune reads back; "
                              f"the state there is left as it was (tune the plan in parts, each into its own output)",
                              file=Path(directory) / STATE_FILE)
        atomic_write(Path(directory) / STATE_FILE, data)


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive flock on the directory (Linux, macOS); nothing where the platform has none."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as e:
        raise OutputError(f"cannot be locked to record the resume state: {e.strerror or e}", file=directory) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
