"""`flytune tune`: run a tuning plan on this device and write artifacts with full provenance.

Each plan entry names a setup `module:function`; `function(**shape)` builds inputs and returns the
call to tune. The call runs with search forced; each search's winner becomes an artifact. Finished
entries are recorded in `<output>/.flytune-tune-state`, so an interrupted plan resumes where it stopped.
A winner the output already holds is kept unless beaten by more than `min_improvement` percent in the
same search (`shipped`); `repeat` searches each shape that many times and reports its stability.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core import fsutil
from ..core.errors import foreign_failure
from ..core.project import Project, TuneEntry
from ..runtime import device, selection
from . import job, placement, stability
from .resume import read_state, snapshot, write_state
from .shipped import MIN_IMPROVEMENT_PCT, OutputWinners


@dataclass
class Result:
    kernel: str
    shape: dict
    key: dict | None
    winner: str
    time_ms: float
    margin: float | None     # runner-up time / winner time - 1
    status: str              # tuned | resumed | no-search | failed (winner: the error)
    change: str = "-"        # new | kept | replaced (+gain%): against the winner the output held
    stable: stability.Stability | None = None   # with --repeat: how many repetitions agreed


def run(project: Project, entries: tuple[TuneEntry, ...], *, output: Path | None = None, resume: bool = True,
        progress: bool = True, ranking: str | None = None, out=sys.stderr,
        min_improvement: float = MIN_IMPROVEMENT_PCT, repeat: int = 1) -> list[Result]:
    """Tune every (entry, shape) not finished by an earlier run; the process's settings, `sys.path` and
    hooks are as they were when it returns."""
    with job.tuning(project.root, ranking):
        return _run(project, entries, output, resume, progress, out, min_improvement, repeat)


def _run(project, entries, output, resume, progress, out, min_improvement=MIN_IMPROVEMENT_PCT,
         repeat=1) -> list[Result]:
    dev = device.current()
    out_dir = placement.expand(output or project.tune_dir, dev)  # {arch}, {backend}, {device}
    fsutil.output_directory(out_dir)
    done = read_state(out_dir) if resume else {}
    base = dict(done) if resume else snapshot(out_dir)  # what other runs add to the state from now on is kept
    jobs = [(e, s) for e in entries for s in e.shapes]
    results: list[Result] = []
    held = OutputWinners(out_dir, min_improvement)
    bar = _bar(len(jobs), progress, out)
    try:
        for entry, shape in jobs:
            jid = job.job_id(entry, shape, dev.spec())
            bar.set_description(f"{entry.kernel} {shape}"[:60])
            if jid in done:
                t_ms = done[jid]["time_ms"]  # null: a time that was not a number
                results.append(Result(entry.kernel, shape, None, done[jid]["winner"],
                                      math.nan if t_ms is None else t_ms, done[jid].get("margin"), "resumed"))
                bar.update(1)
                continue
            try:
                with selection.keeping(held.lookup):  # job.run (a fleet worker's body), `repeat` times
                    tuned = stability.run(project.root, entry, shape, repeat)
            except BaseException as e:  # the user's setup or kernel (sys.exit, pytest.skip too): this entry failed
                if not foreign_failure(e):
                    raise
                results.append(Result(entry.kernel, shape, None, f"{type(e).__name__}: {e}"[:200], math.nan, None,
                                      "failed"))
                print(f"flytune: error: {entry.kernel} {shape}: {type(e).__name__}: {e}", file=out)
                bar.update(1)
                continue
            if not tuned:
                results.append(Result(entry.kernel, shape, None, "-", math.nan, None, "no-search"))
                print(f"flytune: warning: {job.no_search_note(entry, shape)}", file=out)
            for t, stable in tuned:
                change, write = held.change(t.artifact)
                if write:
                    t.artifact.save(out_dir)
                    held.saved(t.artifact)
                results.append(Result(entry.kernel, shape, dict(t.artifact.key), t.winner, t.time_ms, t.margin,
                                      "tuned", change, stable))
                done[jid] = {"winner": t.winner, "time_ms": t.time_ms, "margin": t.margin}
            write_state(out_dir, done, base)
            bar.update(1)
    finally:
        bar.close()
    return results


def _bar(total: int, enabled: bool, out):
    """tqdm's bar on a terminal; elsewhere (a log file, CI) no carriage-return frames, only one plain
    line when the plan is done."""
    tty = getattr(out, "isatty", lambda: False)()
    try:
        from tqdm import tqdm
    except ImportError:  # a dependency; an environment that removed it just gets the plain line
        tqdm = None
    if enabled and tty and tqdm is not None:
        return tqdm(total=total, unit="shape", file=out, dynamic_ncols=True)
    import time

    class _Plain:
        def __init__(self):
            self.done, self.start = 0, time.perf_counter()

        def update(self, n):
            self.done += n

        def set_description(self, d):
            pass

        def close(self):
            if enabled:
                print(f"flytune: {self.done}/{total} shape(s) in {time.perf_counter() - self.start:.1f} s",
                      file=out, flush=True)

    return _Plain()


def summary(results: list[Result]) -> str:
    """The table of winners; with `--repeat`, followed by the stability report."""
    from ..core import table

    rows = [("kernel", "shape", "winner", "time (ms)", "margin", "status", "change")]
    for r in results:
        t = "-" if math.isnan(r.time_ms) else f"{r.time_ms:.4f}"
        m = "-" if r.margin is None else f"{r.margin:+.1%}"
        shape = ",".join(f"{k}={v}" for k, v in r.shape.items())
        rows.append((r.kernel, shape, r.winner, t, m, r.status, r.change))
    text = table.render(rows)
    stable = [(r.kernel, job.shape_text(r.shape), r.stable) for r in results if r.stable is not None]
    return text + "\n\n" + stability.report(stable) if stable else text
