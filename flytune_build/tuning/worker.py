"""A fleet worker: runs jobs of a tuning plan, one at a time, for the driver that started it.

A local worker is `python -m flytune_build.tuning.worker --parent PID`, talking to its driver over its
stdin and stdout in frames: an 8-byte little-endian length, then a JSON array (data only: nothing a
worker sends is executed by the driver):

    driver -> worker   ["setup", project root, ranking, name], then ["job", job id, kernel, setup,
                       autotuner, shape, {"repeat", "min_improvement", "winners", "check", "rtol",
                       "atol", "reference"?, "origin"?}] ...
    worker -> driver   ["hello", device spec, host, pid] | ["start-failed", reason]
                       ["done", job id, device spec, [{"file", "artifact", "winner", "time_ms", "margin",
                       "change", "write", "stability"}, ...]]
                       ["failed", job id, reason, fatal]

It dies with its driver: on Linux the kernel kills it when the driver goes (PR_SET_PDEATHSIG), and it
exits when its stdin closes. Anything a setup prints goes to its log (stderr), never into the
protocol. A Ray actor is a `Resident`: the same jobs, called as methods. A job that raises is that
job's failure; `fatal` says the GPU context is broken and the worker must be replaced.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from ..core import streams
from ..core.artifact import Artifact
from ..core.errors import foreign_failure, one_line
from ..core.project import TuneEntry
from . import job, stability
from .shipped import MIN_IMPROVEMENT_PCT, ShippedWinners

HEADER = struct.Struct("<Q")
PR_SET_PDEATHSIG = 1


def send(stream, message: list) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream) -> list | None:
    """The next message, or None at the end of the stream (also when it ends mid-frame or the frame
    is not a JSON array)."""
    head = _read(stream, HEADER.size)
    body = None if head is None else _read(stream, HEADER.unpack(head)[0])
    try:
        message = None if body is None else json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, list) and message else None


def _read(stream, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def hello() -> list:
    """The worker's device, measured here; torch and triton are imported first, where installed, so
    that a job's time (and `--job-timeout`) is the job's own."""
    from ..runtime import device

    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
        import triton  # noqa: F401
    try:
        return ["hello", device.current().spec(), socket.gethostname(), os.getpid()]
    except Exception as e:
        return ["start-failed", reason(e)]


def execute(root: Path, name: str, jid: str, kernel: str, setup: str, autotuner: str | None, shape: dict,
            options: dict) -> list:
    """Run one job (inside `job.tuning`): `options["repeat"]` searches of it, each keeping the output's
    shipped winners (`options["winners"]`: file name -> artifact text, the shipped winners of this job's kernel)
    unless beaten by more than `options["min_improvement"]` percent. Its artifacts come back as JSON
    text, their provenance naming this host and worker, each with what it did to the output
    (`shipped.ShippedWinners.change`) and whether it is to be written."""
    from ..runtime import device
    from ..runtime.searching import session

    origin = options.get("origin")
    entry = TuneEntry(kernel, setup, (shape,), autotuner, options.get("rtol"), options.get("atol"),
                      options.get("check", True), tuple(origin) if origin else None, options.get("reference"))
    winners = ShippedWinners({n: text.encode() for n, text in (options.get("winners") or {}).items()},
                      options.get("min_improvement", MIN_IMPROVEMENT_PCT))
    try:
        # what the user's setup, kernel hooks or reference print goes to stderr: stdout is the report's
        # (`--json`) in this process and the pipe protocol's in a local worker
        with session.opened(shipped=winners.lookup), streams.to_stderr():
            tuned = stability.run(root, entry, shape, int(options.get("repeat", 1)))
    except BaseException as e:
        if not foreign_failure(e):
            raise
        return ["failed", jid, reason(e), not job.device_healthy()]
    host = socket.gethostname()
    out = []
    for t, stable in tuned:
        a = t.artifact
        a = Artifact(a.kernel, a.key, a.device, a.config, {**(a.provenance or {}), "host": host, "worker": name})
        change, written = winners.change(a)
        if written is not None:
            a = written
            winners.saved(a)
        out.append({"file": a.filename, "artifact": a.to_bytes().decode(), "winner": t.winner, "time_ms": t.time_ms,
                    "margin": t.margin, "change": change, "write": written is not None,
                    "stability": None if stable is None else stable.to_json()})
    return ["done", jid, device.current().spec(), out]


def reason(e: BaseException) -> str:
    """One line: the exception's type and the first line of its message (core.errors.one_line)."""
    return one_line(e)


class Resident:
    """A worker living in another framework's process (a Ray actor): `hello`, then `run` per job."""

    def __init__(self, root: str, ranking: str | None, name: str):
        self.root, self.name = Path(root), name
        self.context = contextlib.ExitStack()
        self.context.enter_context(job.tuning(self.root, ranking))  # for the actor's whole life

    def hello(self) -> list:
        return hello()

    def run(self, jid: str, kernel: str, setup: str, autotuner: str | None, shape: dict, options: dict) -> list:
        return execute(self.root, self.name, jid, kernel, setup, autotuner, shape, options)


def die_with_parent(parent: int) -> None:
    """Linux: the kernel sends SIGKILL when the parent goes; everywhere: exit if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)  # the parent is already gone


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--parent"] and len(argv) > 1:
        die_with_parent(int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    rx = os.fdopen(os.dup(0), "rb", buffering=0)
    tx = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # a setup's prints go to the log, never into the protocol
    setup = receive(rx)
    if not setup or setup[0] != "setup" or len(setup) != 4:
        return 2
    _, root, ranking, name = setup
    with job.tuning(Path(root), ranking):
        greeting = hello()
        send(tx, greeting)
        if greeting[0] != "hello":
            return 1
        return serve(rx, tx, Path(root), name)


def serve(rx, tx, root: Path, name: str) -> int:
    while True:
        message = receive(rx)
        if message is None or message[0] != "job":
            return 0
        _, jid, kernel, setup, autotuner, shape, options = message
        start = time.perf_counter()
        result = execute(root, name, jid, kernel, setup, autotuner, shape, options)
        print(f"[{name}] {kernel} {shape}: {result[0]} in {time.perf_counter() - start:.2f} s",
              file=sys.stderr, flush=True)
        send(tx, result)
        if result[0] == "failed" and result[3]:
            return 1


if __name__ == "__main__":
    raise SystemExit(main())
