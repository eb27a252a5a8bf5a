"""The tuning engine: a plan of (kernel, shape) jobs searched on the target device, winners written as
artifacts with their provenance. `tune()` is the one entry; the `flytune tune` command is one caller.

Every executor (`inprocess`, the default; `local`; `ray`) runs the same driver (`driver`), the same job
body (`job`, `worker.execute`) and the same keep-or-replace rule (`shipped`): an output's winners are
kept or replaced the same way wherever the jobs run.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..core import arguments, codec, fsutil
from ..core import project as project_mod
from ..core import settings
from ..core.errors import NoTable, UsageError
from . import fingerprint
from .driver import MIN_IMPROVEMENT_PCT, Options, Outcome, Report, Reporter
from .job import load_references, unknown_kernels

MAX_REPEAT = 100   # `repeat`: a typo such as 30 000 for 3 would search every shape for days

__all__ = ["MIN_IMPROVEMENT_PCT", "Outcome", "Report", "Reporter", "tune"]


def tune(project: str | Path | project_mod.Project = ".", *, plan: str | Path | None = None, kernels=None,
         output: str | Path | None = None, executor: str | None = None, repeat: int = 1,
         min_improvement: float | None = None, resume: bool = True, ranking: str | None = None,
         job_timeout: float | None = None, reporter: Reporter | None = None, workers: int | None = None,
         address: str | None = None, allow_ci: bool = False, misses: str | Path | None = None) -> Report:
    """Tune the project's plan (or `plan`, a TOML file) on `executor`'s workers and write the winners
    under `output` (a template: {arch}, {backend}, {device}; default `tool.flytune.tune.output`).

    Returns the `Report`: an `Outcome` per job and artifact (status, winner, change against the
    output's shipped winners, stability with `repeat` > 1, failures with their reason). Prints nothing;
    `reporter` hears of progress as it happens. Raises UsageError when the run cannot start as asked
    (nothing is written; a PlanError for an entry's `reference` that cannot be used is one), ProjectError
    for a project without `[tool.flytune]` (a UsageError where `project` is no directory); a job that fails
    is an outcome, never an exception. Where CI is set, a measured run is refused unless `allow_ci`.
    `misses` (a FLYTUNE_MISSES file) tunes exactly the shapes a serving process missed (core.misses).
    """
    job_timeout = arguments.seconds(job_timeout, "job_timeout")  # nan would mean none, -1 fail every job
    allow_ci, resume = arguments.flag(allow_ci, "allow_ci"), arguments.flag(resume, "resume")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        arguments.count(workers, "workers")  # the type, by the one rule; the range is the executor's to say
    if kernels is not None and not isinstance(kernels, str):
        kernels = arguments.names(kernels, "kernels")
    if kernels is not None and len(kernels) == 0:   # [] is no kernel, never every kernel (None is every kernel)
        raise UsageError("is empty: name at least one kernel of the plan to tune (or leave kernels out to tune "
                         "every kernel)", field="kernels")
    plan = None if plan is None or plan == "" else arguments.path(plan, "plan")   # "": the default, as ever
    margin = MIN_IMPROVEMENT_PCT if min_improvement is None else arguments.percent(min_improvement, "min_improvement")
    ranking = arguments.choice(ranking, "ranking", (None, *settings.RANKINGS))
    output = None if output == "" else output   # the default, as every release read it (never the current directory)
    if output is not None:
        _check_output(Path(arguments.path(output, "output")))
        project_mod.check_output_template(str(output), codec.Fields(None, UsageError), "output")
    proj = project if isinstance(project, project_mod.Project) else \
        _load(Path(arguments.path(project, "project")).resolve())
    entries = _entries(proj, plan, kernels)
    missed_notes: list[str] = []
    if misses is not None:
        from ..core import misses as misses_file

        path = Path(arguments.path(misses, "misses"))
        entries, missed = misses_file.plan(misses_file.read(path), entries, path)
        missed_notes = [f"flytune: warning: {note}" for note in missed]
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise UsageError(f"repeat must be an integer from 1 to {MAX_REPEAT}, not {repeat!r} (each repetition "
                         f"searches every shape again)")
    if settings.current().ci and not allow_ci and (ranking or settings.current().ranking) != "synthetic":
        raise UsageError("refusing to tune where CI is set: shared runners do not choose winners (tune on the "
                         "intended GPU; allow_ci=True or --allow-ci overrides)")
    options = Options("inprocess" if executor is None else executor, workers, address, job_timeout, resume, ranking,
                      str(Path(output).resolve()) if output is not None else None, repeat, margin)
    load_references(proj.root, entries)  # a plan naming a reference that cannot be used is refused first
    fingerprints = fingerprint.of_plan(proj.root, entries)
    for note in missed_notes if reporter is not None else ():  # told as every note is: the text output has them
        reporter.note(note)
    report = _run(proj, entries, options, reporter, fingerprints)
    report.notes[:0] = missed_notes
    return report


def _check_output(path: Path) -> None:
    """An OutputError, before anything runs, where the output is there and is no directory (`/dev/null`,
    a file); a template (`artifacts/{arch}`) is checked as it is written."""
    if os.path.exists(path) and not path.is_dir():
        raise fsutil.not_a_directory(path)


def _load(root: Path) -> project_mod.Project:
    """The project's `[tool.flytune]`; where it has none, a ProjectError saying what to do: rename the tool
    table that looks like it (`[tool.flytun]`), or write one with `flytune init`. `root` is the project's
    directory: a path to its pyproject.toml, or to nothing, is a UsageError saying so."""
    if not root.is_dir():
        raise UsageError(f"{'is not a directory' if os.path.lexists(root) else 'does not exist'}: pass the "
                         f"project's directory, the one that holds its pyproject.toml (--project DIR, project=DIR)",
                         file=root)
    proj = project_mod.load(root)
    if proj is None:
        close = project_mod.misnamed(project_mod.read_pyproject(root))   # the build's rule: it refuses that table
        fix = f"is that [{close}]? rename it [tool.flytune]; else " if close else ""
        raise NoTable(f"has no [tool.flytune] table ({fix}run `flytune init` to write one: it finds the "
                      f"package's kernels and writes the table, a tuning plan and its setups)",
                      file=root / "pyproject.toml")
    return proj


def _entries(proj: project_mod.Project, plan, kernels) -> tuple:
    plan = Path(plan).resolve() if plan else proj.tune_plan  # a plan argument is relative to the cwd
    if plan:
        entries = project_mod.load_plan(proj.root, plan)   # its repeats refused as it is read
    else:
        entries = proj.tune_entries
        project_mod.check_repeats(entries)
    if kernels:
        kernels = [kernels] if isinstance(kernels, str) else list(kernels)
        unknown = sorted(set(kernels) - {e.kernel for e in entries})
        if unknown:
            raise unknown_kernels(unknown, {e.kernel for e in entries}, "in the tuning plan")
        entries = tuple(e for e in entries if e.kernel in kernels)
    if not entries and plan:
        raise UsageError("is empty: the tuning plan names nothing to tune (add [[entries]] with kernel, setup and "
                         "shapes; `flytune init` writes a plan of the package's kernels)",
                         file=plan if Path(plan).is_absolute() else proj.root / plan, field="entries")
    if not entries:
        raise UsageError("the tuning plan is empty: declare [tool.flytune.tune] entries or a plan in "
                         "pyproject.toml, or pass a plan (`flytune init` writes one)",
                         file=proj.root / "pyproject.toml")
    return entries


def _run(proj, entries, options: Options, reporter, fingerprints: dict | None = None) -> Report:
    from . import executors
    from .driver import Driver

    log_dir = Path(tempfile.mkdtemp(prefix="flytune-tune-"))
    report = None
    try:
        executor = executors.open_executor(options.executor, proj, options.ranking, workers=options.workers,
                                           address=options.address, job_timeout=options.job_timeout,
                                           jobs=sum(len(e.shapes) for e in entries), log_dir=log_dir)
        report = Driver(proj, entries, options, executor, reporter, fingerprints).run()
        return report
    finally:  # a local worker's log says why it died: kept when a job failed
        if report is not None and report.failed and any(log_dir.iterdir()):
            report.logs = log_dir
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
