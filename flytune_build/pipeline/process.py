"""The bundle made in a forked process while the backend builds the wheel in this one.

Two independent jobs: on two cores a build costs the longer of them rather than their sum. Where
forking is not safe (not Linux, or threads running), or the child gives no answer, the bundle is
made in this process instead; errors read the same either way.
"""
from __future__ import annotations

import io
import sys
import threading

from ..core.errors import FlytuneError
from ..core.project import Project
from .state import BuildState

STOP_WAIT = 5.0  # seconds for the child to end at each step: on its own, after SIGTERM, after SIGKILL


class BackgroundBundle:
    """collect -> verify -> assemble for `project`, started now; `result()` waits for it."""

    def __init__(self, project: Project, run):
        self._project = project
        self._run = run            # the pipeline's run(root, out=...): raises FlytuneError on failure
        self._state = None
        self._proc = None
        self._answered = False
        if not (sys.platform.startswith("linux") and threading.active_count() == 1):
            self._state = run(project.root, project=project)
            return
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        sys.stdout.flush()
        sys.stderr.flush()
        # daemonic: an interpreter that exits without asking for the result (the wrapped build raised)
        # stops it instead of waiting on a child blocked writing a pipe no one reads
        self._proc = ctx.Process(target=self._child, args=(send,), daemon=True)
        self._proc.start()
        send.close()

    def _child(self, send) -> None:
        out = io.StringIO()
        try:
            state = self._run(self._project.root, out=out, project=self._project)
            send.send(("ok", state.files, state.entry_point, out.getvalue()))
        except FlytuneError as e:
            send.send(("error", e, out.getvalue()))
        except BaseException as e:  # noqa: BLE001 - reported by re-running in the parent
            send.send(("crash", repr(e), out.getvalue()))
        finally:
            send.close()

    def result(self) -> BuildState:
        """The assembled state; a FlytuneError exactly as an in-process build raises it."""
        if self._proc is None:
            return self._state
        try:
            answer = self._recv.recv()
        except (EOFError, OSError):
            answer = None
        self._answered = True
        self.close()
        if answer is None or answer[0] == "crash":  # the child died or broke: do it here, in the open
            return self._run(self._project.root, project=self._project)
        sys.stderr.write(answer[-1])  # the build report, as an inline build prints it
        sys.stderr.flush()
        if answer[0] == "error":
            raise answer[1]
        state = BuildState(self._project)
        state.files, state.entry_point = answer[1], answer[2]
        return state

    def close(self) -> None:
        """Stop and reap the child with a bounded wait: after `result` (it is ending), or when the build
        failed before asking for it (it may be working, or blocked writing its answer: it is stopped).
        Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        answered = self._answered
        self._recv.close()  # a child still writing gets EPIPE
        if answered:
            proc.join(STOP_WAIT)
        for stop in (proc.terminate, proc.kill):
            if proc.exitcode is not None:
                break
            stop()
            proc.join(STOP_WAIT)
        if proc.exitcode is not None:
            proc.close()
