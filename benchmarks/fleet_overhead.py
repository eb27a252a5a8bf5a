"""What a tuning fleet costs on this CPU: per-job scheduling overhead, and N workers against one.

Jobs are searches of a stub kernel (its launch does nothing) ranked synthetically, so each job goes
the whole way (search, artifact, JSON over the worker's pipe, atomic publish with the resume state)
at almost no cost of its own.

- overhead: the same K trivial jobs tuned by the in-process executor (`flytune tune`'s default) and by a
  fleet of one local worker; (fleet job phase - in-process job phase) / K is what a worker process adds
  per job (goal <= 5 ms).
- scaling: J CPU-bound jobs (each spins the CPU for S seconds) on 1 worker and on N; the ratio of
  the job phases, from every worker up to the last job done (goal for 2 workers on 2 cores:
  <= 0.6). Start-up (a worker imports torch and triton) and shutdown are reported apart.

    python benchmarks/fleet_overhead.py [--jobs 200] [--cpu-jobs 8] [--seconds 0.5] [--workers 2] [--rounds 3]
"""
import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"   # CPU workers, the interpreter's device identity
os.environ["FLYTUNE_AUTOTUNE"] = "0"

from flytune_build.tuning import driver as fleet
from flytune_build.tuning import executors
from flytune_build.core import project as project_mod

SETUPS = '''
import flytune_build as ft
from flytune_build import Config


def _body(x, n, BLOCK):
    pass


class Stub:
    """A launcher whose launch does nothing: a search is the autotuner's own work only."""
    fn = staticmethod(_body)
    arg_names = ["x", "n", "BLOCK"]

    def run(self, *args, **kwargs):
        return None


kernel = ft.autotune([Config({"BLOCK": b}) for b in (16, 32, 64, 128)], ["n"], name="bench.stub")(Stub())


def trivial(n):
    return lambda: kernel[(1,)](None, n)


def spin(n, seconds):
    def call():
        end = time.process_time() + seconds   # CPU time: the job is CPU-bound, not asleep
        while time.process_time() < end:
            pass
        kernel[(1,)](None, n)
    return call
'''


def make_project(root: Path, jobs: int, cpu_jobs: int, seconds: float) -> Path:
    (root / "benchpkg").mkdir(parents=True)
    (root / "benchpkg" / "__init__.py").write_text("")
    (root / "benchpkg" / "setups.py").write_text(SETUPS)
    trivial = ", ".join(f"{{ n = {i} }}" for i in range(1, jobs + 1))
    spin = ", ".join(f"{{ n = {100_000 + i}, seconds = {seconds} }}" for i in range(cpu_jobs))
    (root / "pyproject.toml").write_text(textwrap.dedent(f'''
        [tool.flytune]
        package = "benchpkg"
        sources = ["artifacts"]
        targets = ["interpreter"]

        [tool.flytune.tune]
        output = "out"
        entries = [
          {{ kernel = "bench.stub", setup = "benchpkg.setups:trivial", shapes = [{trivial}] }},
          {{ kernel = "bench.stub", setup = "benchpkg.setups:spin", shapes = [{spin}] }},
        ]
        '''))
    return root


def fleet_run(proj, entries, workers: int, output: Path, log_dir: Path, kind: str = "local"):
    options = fleet.Options(kind, workers, output=str(output), ranking="synthetic", resume=False)
    ex = executors.open_executor(kind, proj, "synthetic", workers=None if kind == "inprocess" else workers,
                                 address=None, job_timeout=None, jobs=sum(len(e.shapes) for e in entries),
                                 log_dir=log_dir)
    report = fleet.Driver(proj, entries, options, ex).run()
    assert not report.failed, [o.reason for o in report.failed]
    return report


def overhead(proj, tmp: Path, rounds: int) -> None:
    (entry,) = [e for e in proj.tune_entries if e.setup.endswith(":trivial")]
    k = len(entry.shapes)
    sys.path.insert(0, str(proj.root))
    import benchpkg.setups
    import torch
    import triton
    best_in, best_fleet = float("inf"), float("inf")
    for r in range(rounds):
        from flytune_build.runtime.serving import autotuner

        autotuner.reset_stats()
        best_in = min(best_in, fleet_run(proj, (entry,), 1, tmp / f"inproc-{r}", tmp / "logs", "inprocess").jobs_s)
        report = fleet_run(proj, (entry,), 1, tmp / f"fleet-{r}", tmp / "logs")
        best_fleet = min(best_fleet, report.jobs_s)
    print(f"overhead: {k} trivial jobs; in process {best_in * 1e3 / k:.2f} ms/job, fleet of 1 local worker "
          f"{best_fleet * 1e3 / k:.2f} ms/job (job phase, best of {rounds})")
    print(f"overhead: the fleet adds {(best_fleet - best_in) * 1e3 / k:.2f} ms per job (goal <= 5 ms)")


def scaling(proj, tmp: Path, workers: int, rounds: int) -> None:
    (entry,) = [e for e in proj.tune_entries if e.setup.endswith(":spin")]
    phases, walls = {1: [], workers: []}, {1: [], workers: []}
    for r in range(rounds):
        for n in (1, workers):  # interleaved: a load spike on this shared machine hits both
            report = fleet_run(proj, (entry,), n, tmp / f"spin-{n}-{r}", tmp / "logs")
            phases[n].append(report.jobs_s)
            walls[n].append(report.elapsed_s)
    one, many = min(phases[1]), min(phases[workers])
    seconds = entry.shapes[0]["seconds"]
    print(f"scaling: {len(entry.shapes)} jobs of {seconds} s CPU each; job phase 1 worker {one:.2f} s, "
          f"{workers} workers {many:.2f} s; ratio {many / one:.2f} (goal <= 0.6 for 2 workers on 2 cores)")
    print(f"scaling: with start-up and shutdown, 1 worker {min(walls[1]):.2f} s, {workers} workers {min(walls[workers]):.2f} s; "
          f"ratio {min(walls[workers]) / min(walls[1]):.2f} (best of {rounds}; {cpus()} CPUs for this process)")


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))   # `taskset -c 0,1` gives 2, whatever the machine has
    except AttributeError:
        return os.cpu_count() or 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200, help="trivial jobs for the overhead")
    p.add_argument("--cpu-jobs", type=int, default=8, help="CPU-bound jobs for the scaling")
    p.add_argument("--seconds", type=float, default=0.5, help="CPU seconds per CPU-bound job")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["FLYTUNE_CACHE_DIR"] = str(tmp / "cache")
        proj = project_mod.load(make_project(tmp / "proj", args.jobs, args.cpu_jobs, args.seconds))
        overhead(proj, tmp, args.rounds)
        scaling(proj, tmp, args.workers, args.rounds)


if __name__ == "__main__":
    main()
