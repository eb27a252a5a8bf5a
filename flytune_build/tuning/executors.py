"""Where a tuning run's workers run: this process (`inprocess`, the default), local processes (one per
GPU), or Ray actors across a cluster. The driver (`tuning.driver`) is the same for all three.

An executor starts a worker in a numbered slot, gives it one job at a time and reports what happened
as events, tuples whose second item is the slot:

    ("hello", slot, device spec, host, pid)      the worker is up and measured its device
    ("start-failed", slot, reason)               it could not start (no device, a broken install)
    ("done", slot, job id, device spec, results) see `worker.execute`
    ("failed", slot, job id, reason, fatal)      the job raised; fatal: the worker must be replaced
    ("died", slot, reason)                       the worker is gone (a crash, a signal, an exit)

`kill(slot)` ends a slot's worker and drops its events; `start(slot)` starts a fresh one.
"""
from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..core import settings
from ..core.errors import UsageError, one_line
from ..core.project import Project
from . import job as job_mod
from . import worker
from .job import Job

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the directory holding flytune_build


KINDS = ("inprocess", "local", "ray")


NO_GPU = ("no GPU is visible, and a search runs the kernels: tune on the GPU you ship for, or, on a CPU, for the "
          "interpreter target: TRITON_INTERPRET=1 flytune tune --ranking synthetic")


class Unavailable(UsageError):
    """The executor cannot run here (Ray is missing, no GPU is visible, too many workers asked for)."""


def open_executor(kind: str, project: Project, ranking: str | None, *, workers: int | None, address: str | None,
                  job_timeout: float | None, jobs: int, log_dir: Path):
    """The executor `kind` names, started for this project; Unavailable when it cannot run as asked."""
    if kind not in KINDS:
        raise Unavailable(f"executor {kind!r}: must be one of {', '.join(KINDS)}")
    if workers is not None and workers < 1:
        raise Unavailable(f"--workers must be at least 1, not {workers}")
    if address and kind != "ray":
        raise Unavailable("--address needs --executor ray")
    if kind == "inprocess":
        if workers not in (None, 1):
            raise Unavailable(f"--workers {workers}: the in-process executor is one worker (use --executor local)")
        if job_timeout is not None:
            raise Unavailable("--job-timeout stops a job's worker, which this process cannot do to itself "
                              "(use --executor local or ray)")
        if not settings.current().interpret and not gpu_ids()[1]:
            raise Unavailable(NO_GPU)
        return InProcessExecutor(project, ranking)
    if kind == "ray":
        return RayExecutor(project, ranking, workers, address)
    return local(project, ranking, workers, log_dir, jobs)


class InProcessExecutor:
    """One worker: this process. A job runs when the driver polls, in this thread; the settings,
    `sys.path` and hooks `job.tuning` changes are as they were once the executor is closed."""

    kind = "inprocess"
    slots = 1

    def __init__(self, project: Project, ranking: str | None):
        self.project, self.ranking = project, ranking
        self.context: contextlib.ExitStack | None = None
        self.events: list[tuple] = []
        self.jobs: list[Job] = []

    def name(self, slot: int) -> str:
        return "inprocess"

    def log(self, slot: int) -> Path | None:
        return None

    def start(self, slot: int) -> None:
        if self.context is None:
            self.context = contextlib.ExitStack()
            self.context.enter_context(job_mod.tuning(self.project.root, self.ranking))
        message = worker.hello()
        self.events.append((message[0], slot, *message[1:]))

    def submit(self, slot: int, job: Job, options: dict) -> None:
        self.jobs.append((job, options))

    def poll(self, timeout: float) -> list[tuple]:
        if not self.events and self.jobs:
            job, options = self.jobs.pop(0)
            e = job.entry
            message = worker.execute(self.project.root, self.name(0), job.id, e.kernel, e.setup, e.autotuner,
                                     job.shape, job_mod.carried(e, options))
            self.events.append((message[0], 0, *message[1:]))
        events, self.events = self.events, []
        return events

    def kill(self, slot: int) -> None:
        self.events, self.jobs = [], []

    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self.kill(0)
        if self.context is not None:
            self.context.close()
            self.context = None


def gpu_ids() -> tuple[str, list[str]]:
    """(the variable that pins a GPU, the ids a worker may be pinned to), from torch's count and the
    GPUs this process was given."""
    import torch

    n = torch.cuda.device_count()
    var = "HIP_VISIBLE_DEVICES" if getattr(torch.version, "hip", None) else "CUDA_VISIBLE_DEVICES"
    given = dict(settings.current().visible_devices).get(var)
    ids = [i.strip() for i in given.split(",") if i.strip()] if given else [str(i) for i in range(n)]
    return var, ids[:n]


def local(project: Project, ranking: str | None, workers: int | None, log_dir: Path,
          jobs: int) -> LocalExecutor:
    """One process per visible GPU, each pinned to its GPU; CPU processes under the interpreter."""
    if settings.current().interpret:
        n = workers or max(1, min(os.cpu_count() or 1, jobs))
        return LocalExecutor(project, ranking, n, lambda slot: {}, log_dir)
    var, ids = gpu_ids()
    if not ids:
        raise Unavailable(NO_GPU)
    if workers and workers > len(ids):
        raise Unavailable(f"--workers {workers}: only {len(ids)} GPU(s) are visible ({var}={','.join(ids)})")
    return LocalExecutor(project, ranking, workers or len(ids), lambda slot: {var: ids[slot]}, log_dir)


class LocalExecutor:
    """Worker processes on this machine (`python -m flytune_build.tuning.worker`), one pipe each."""

    kind = "local"

    def __init__(self, project: Project, ranking: str | None, slots: int,
                 env_for_slot: Callable[[int], dict], log_dir: Path):
        self.project, self.ranking, self.slots = project, ranking, slots
        self.env_for_slot, self.log_dir = env_for_slot, Path(log_dir)
        self.procs: dict[int, subprocess.Popen] = {}
        self.log_start: dict[int, int] = {}   # where the slot's current worker began its log
        self.selector = selectors.DefaultSelector()

    def name(self, slot: int) -> str:
        return f"local:{slot}"

    def log(self, slot: int) -> Path:
        return self.log_dir / f"worker-{slot}.log"

    def start(self, slot: int) -> None:
        env = {**os.environ, **self.env_for_slot(slot)}
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                              if p and p != PACKAGE_ROOT])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log(slot), "ab") as log:  # spawned from this thread: PDEATHSIG follows it
            self.log_start[slot] = log.seek(0, os.SEEK_END)
            proc = subprocess.Popen([sys.executable, "-m", "flytune_build.tuning.worker", "--parent", str(os.getpid())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, bufsize=0)
        self.procs[slot] = proc
        self.selector.register(proc.stdout, selectors.EVENT_READ, slot)
        self._send(slot, ["setup", str(self.project.root), self.ranking, self.name(slot)])

    def submit(self, slot: int, job: Job, options: dict) -> None:
        e = job.entry
        self._send(slot, ["job", job.id, e.kernel, e.setup, e.autotuner, job.shape, job_mod.carried(e, options)])

    def _send(self, slot, message):
        try:
            worker.send(self.procs[slot].stdin, message)
        except (BrokenPipeError, ValueError):
            pass  # it died: its pipe's end of file says so on the next poll

    def poll(self, timeout: float) -> list[tuple]:
        events = []
        for key, _ in self.selector.select(max(timeout, 0)):
            slot = key.data
            message = worker.receive(key.fileobj)
            if message is None:
                events.append(("died", slot, self._reap(slot)))
            else:
                events.append((message[0], slot, *message[1:]))
        # the process, not only its pipe: a child a setup forked may hold the pipe open after the worker died
        for slot in [slot for slot, proc in self.procs.items() if proc.poll() is not None]:
            events += self._drain(slot)
        return events

    def _drain(self, slot: int) -> list[tuple]:
        """The messages an exited worker wrote before it ended (read without waiting for an end of file that
        a process still holding its pipe would withhold), then its death."""
        pipe = self.procs[slot].stdout
        events = []
        try:
            os.set_blocking(pipe.fileno(), False)
            while (message := worker.receive(pipe)) is not None:  # a non-blocking read with nothing left: None
                events.append((message[0], slot, *message[1:]))
        except OSError:  # nothing readable left
            pass
        return events + [("died", slot, self._reap(slot))]

    def _reap(self, slot: int) -> str:
        proc = self._forget(slot)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its pipe closed but it lingers: it is not coming back
            proc.kill()
            rc = proc.wait()
        if rc < 0:
            return f"killed its worker ({signal.Signals(-rc).name})"
        last = self._last_words(slot)
        return f"its worker exited with status {rc}" + (f" ({last})" if last else "")

    def _last_words(self, slot: int) -> str:
        """The last line this worker wrote to its log, unless it is one of its own job lines."""
        try:
            with open(self.log(slot), "rb") as fh:
                fh.seek(max(fh.seek(0, os.SEEK_END) - 4096, self.log_start.get(slot, 0)))
                lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        if not lines or lines[-1].startswith(f"[{self.name(slot)}]"):
            return ""
        return lines[-1] if len(lines[-1]) <= 200 else lines[-1][:197] + "..."

    def _forget(self, slot: int) -> subprocess.Popen:
        proc = self.procs.pop(slot)
        self.selector.unregister(proc.stdout)
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return proc

    def kill(self, slot: int) -> None:
        if slot in self.procs:
            proc = self._forget(slot)
            proc.kill()
            proc.wait()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def close(self) -> None:
        procs = [self._forget(slot) for slot in list(self.procs)]  # their stdin closes: each exits
        deadline = time.monotonic() + 5  # or is killed (a job still running, after Ctrl-C)
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.selector.close()


SETTLE_S = 5.0  # how long a dead actor's results already on their way are waited for


class RayExecutor:
    """One Ray actor per worker: `num_gpus=1` each (Ray pins its GPU), `num_cpus=1` under the interpreter."""

    kind = "ray"

    def __init__(self, project: Project, ranking: str | None, workers: int | None, address: str | None):
        try:
            import ray
        except ImportError:
            raise Unavailable("--executor ray needs Ray, which is not installed "
                              "(pip install 'flytune-build[ray]')") from None
        self.ray, self.project, self.ranking = ray, project, ranking
        env = settings.triton_env()  # TRITON_INTERPRET and the compiler's variables, on every node
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                     runtime_env={"env_vars": env} if env else None)
        except Exception as e:
            raise Unavailable(f"cannot start or reach the Ray cluster{f' at {address}' if address else ''}: "
                              f"{worker.reason(e)}") from None
        interpret = settings.current().interpret
        resource = "CPU" if interpret else "GPU"
        have = int(ray.cluster_resources().get(resource, 0))
        if not have or (workers and workers > have):
            ray.shutdown()
            raise Unavailable(f"the Ray cluster has {have} {resource}(s)"
                              + (f"; --workers {workers} asks for more" if have else ""))
        self.slots = workers or have
        # Ray's driver prints the raylet's notes (an actor that died, ...) on stdout, where only the
        # summary belongs: while the fleet runs they go to stderr, beside our own account of them
        self.stdout, sys.stdout = sys.stdout, sys.stderr
        options = {"num_cpus": 1} if interpret else {"num_gpus": 1}
        self.actor = ray.remote(max_restarts=0, **options)(worker.Resident)
        self.actors: dict[int, object] = {}
        self.pending: dict[object, tuple[int, str | None]] = {}   # ref -> (slot, job id; None: hello), in hand-out order
        self.deaths: dict[int, str] = {}  # slot -> how its actor died, until reported

    def name(self, slot: int) -> str:
        return f"ray:{slot}"

    def log(self, slot: int) -> Path | None:
        return None

    def start(self, slot: int) -> None:
        actor = self.actor.remote(str(self.project.root), self.ranking, self.name(slot))
        self.actors[slot] = actor
        self.pending[actor.hello.remote()] = (slot, None)

    def submit(self, slot: int, job: Job, options: dict) -> None:
        e = job.entry
        ref = self.actors[slot].run.remote(job.id, e.kernel, e.setup, e.autotuner, job.shape,
                                           job_mod.carried(e, options))
        self.pending[ref] = (slot, job.id)

    def poll(self, timeout: float) -> list[tuple]:
        if not self.pending:
            return []
        ray = self.ray
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=max(timeout, 0))
        if ready:
            ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        # in the order they were handed out, not `ray.wait`'s: a job's result comes before the death
        # of its actor in the job handed ahead, and a death drops that actor's later refs
        ready = set(ready)
        events = []
        for ref in [r for r in self.pending if r in ready]:
            if ref not in self.pending:
                continue  # its actor died on an earlier ref of this batch: reported once, with that one
            slot = self.pending[ref][0]
            if not self._report(ref, events):  # the actor died: first what it finished before (a result
                earlier = [r for r, (s, _) in self.pending.items() if s == slot]  # may trail its death),
                if earlier:  # in the order handed out, then the death, once
                    done, _ = ray.wait(earlier, num_returns=len(earlier), timeout=SETTLE_S)
                    for r in [r for r in earlier if r in done]:
                        self._report(r, events)
                self.kill(slot)
                events.append(("died", slot, f"killed its Ray actor ({self.deaths.pop(slot)})"))
        return events

    def _report(self, ref, events: list) -> bool:
        """Append the event of a finished ref; False (nothing appended) when its actor died."""
        slot, jid = self.pending.pop(ref)
        try:
            message = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            self.deaths.setdefault(slot, _first_line(e))
            return False
        except Exception as e:
            message = ["start-failed", worker.reason(e)] if jid is None else ["failed", jid, worker.reason(e), True]
        events.append((message[0], slot, *message[1:]))
        return True

    def kill(self, slot: int) -> None:
        actor = self.actors.pop(slot, None)
        for ref in [r for r, (s, _) in self.pending.items() if s == slot]:
            del self.pending[ref]
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass  # already gone

    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        for slot in list(self.actors):
            self.kill(slot)
        self.ray.shutdown()
        sys.stdout = self.stdout


def _first_line(e: BaseException) -> str:
    return one_line(e, with_type=False, limit=200)  # a Ray error's first line names what failed
