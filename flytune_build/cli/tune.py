"""`flytune tune`: the arguments of `tuning.tune`, its progress on stderr, its report on stdout."""
from __future__ import annotations

import argparse
import math
import sys

from ..core import arguments, table
from ..core.errors import UsageError, printable
from . import flags, render
from .progress import Progress
from .output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, dump


def add_command(command) -> None:
    t = command("tune", "search a tuning plan on this device and write artifacts",
                "0 tuned, 1 failed, 2 usage error or refused where CI is set, 130 interrupted")
    t.add_argument("--project", default=".", help="project root holding pyproject.toml (default: .)")
    t.add_argument("--plan", help="a plan TOML file (default: [tool.flytune.tune])")
    t.add_argument("--misses", metavar="FILE", help="tune exactly the shapes a FLYTUNE_MISSES file recorded, with "
                   "the plan's setups")
    t.add_argument("--output", help="artifact directory (default: tool.flytune.tune.output)")
    t.add_argument("--kernel", action="append", help="tune only this kernel (repeatable)")
    t.add_argument("--ranking", choices=("measured", "synthetic"), default=None,
                   help="synthetic: deterministic ranking, never a measurement (interpreter/CI artifacts)")
    t.add_argument("--no-resume", action="store_true", help="re-tune entries finished by an earlier run")
    t.add_argument("--min-improvement", type=percent, default=None, metavar="PCT",
                   help="keep a winner the output already holds unless another config is faster by more than "
                        "PCT percent, measured in the same search (default: 3)")
    t.add_argument("--repeat", type=flags.count, default=1, metavar="K",
                   help="search each shape K times (1-100) and report how many agreed; the majority winner is written")
    t.add_argument("--allow-ci", action="store_true", help="run even where CI is set")
    t.add_argument("--json", action="store_true", help="print the report as JSON (\"format\": 1) instead of the table")
    t.add_argument("--no-progress", action="store_true", help="no progress at all (off a terminal there is "
                                                              "no bar, only one plain line per job)")
    g = t.add_argument_group("executors (where the jobs run; the same rules on each)")
    g.add_argument("--executor", choices=("inprocess", "local", "ray"), default=None,
                   help="inprocess (default): this process; local: one worker process per visible GPU; "
                        "ray: one Ray actor per GPU of a cluster")
    g.add_argument("--workers", type=int, metavar="N",
                   help="how many workers (default: one per GPU; under TRITON_INTERPRET=1, one per CPU)")
    g.add_argument("--address", metavar="ADDR", help="ray: the cluster to join, as ray.init takes it "
                                                     "(default: start a local one)")
    g.add_argument("--job-timeout", type=flags.seconds, metavar="SECONDS",
                   help="a job running longer fails: its worker is replaced and the job retried once "
                        "(local and ray)")


def percent(text: str) -> float:
    """A percentage from 0 to below 1000 (`core.arguments.percent`): argparse names the flag that was refused."""
    try:
        return arguments.percent(float(text), "percent")
    except (ValueError, UsageError):
        raise argparse.ArgumentTypeError(f"must be a percentage from 0 to below 1000, not {text!r}") from None


def command(args) -> int:
    from .. import tuning

    if args.executor is None and (args.workers is not None or args.address or args.job_timeout is not None):
        print("flytune: error: --workers, --address and --job-timeout need --executor local or ray", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = tuning.tune(args.project, plan=args.plan, kernels=args.kernel, output=args.output, misses=args.misses,
                             executor=args.executor, repeat=args.repeat, min_improvement=args.min_improvement,
                             resume=not args.no_resume, ranking=args.ranking, job_timeout=args.job_timeout,
                             workers=args.workers, address=args.address, allow_ci=args.allow_ci,
                             reporter=Progress(enabled=not args.no_progress))
    except UsageError as e:
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(dump(report.to_json()))
        return EXIT_OK if report.ok else EXIT_FAILED
    print(summary(report))
    workers = sum(s.state != "retired" for s in report.slots)
    changes = ", ".join(f"{n} {c}" for c, n in report.changes().items())
    print(f"flytune: {report.count('tuned')} tuned, {report.count('resumed')} resumed, {len(report.failed)} failed, "
          f"in {report.elapsed_s:.1f} s on {workers} {report.executor} worker(s); against the output's winners: "
          f"{changes}" + "".join(f"; {n} re-tuned: {why}" for why, n in report.retuned().items()))
    if report.logs is not None:
        print(f"flytune: worker logs in {report.logs}", file=sys.stderr)
    for o in report.failed:
        print(printable(f"flytune: error: {o.job.label()}: {o.reason}"), file=sys.stderr)
    if report.failed:
        print(f"flytune: error: {len(report.failed)} job(s) failed (see the table)", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED


def sure(o) -> str:
    """How sure the choice is (provenance.selection.confidence), `?` where a test sat at the band's edge
    when the search's budget ran out; `-` where the search recorded none (a synthetic ranking)."""
    if o.confidence is None:
        return "-"
    return f"{o.confidence:.3f}" + ("" if o.resolved is not False else "?")


def time_text(time_ms: float | None, ranking: str | None) -> str:
    """A winner's time in milliseconds; a synthetic ranking's number is a rank, and says so."""
    if time_ms is None or math.isnan(time_ms):
        return "-"
    return f"rank {time_ms:.4f}" if ranking == "synthetic" else f"{time_ms:.4f}"


def summary(report) -> str:
    """The table of outcomes; with repeat > 1, followed by the stability table; then each failure."""
    from ..tuning.job import shape_text

    several = len(report.directories) > 1
    fleet = report.executor != "inprocess"
    rows = [("kernel", "shape") + (("device",) if several else ()) +
            ("winner", "time (ms)", "margin", "sure", "status", "change") + (("worker",) if fleet else ())]
    for o in report.outcomes:
        t = time_text(o.time_ms, o.ranking)
        m = "-" if o.margin is None else f"{o.margin:+.1%}"
        where = "-" if o.worker == "-" else f"{o.worker}@{o.host}"
        rows.append((o.job.entry.kernel, shape_text(o.job.shape)) + ((o.job.device,) if several else ()) +
                    (o.winner, t, m, sure(o), o.status, o.change) + ((where,) if fleet else ()))
    lines = [table.render(rows)]
    stable = [(o.job.entry.kernel, shape_text(o.job.shape), o.stable) for o in report.outcomes if o.stable]
    if stable:
        lines.append("\n" + render.render_stability(stable))
    for o in report.outcomes:   # never silent: a candidate refused for its output is a kernel bug at that config
        if o.wrong[0]:
            which = "" if o.change.startswith("kept") else " (the artifact written records which, and how)"
            lines.append(printable(f"refused: {o.job.label()}: {o.wrong[0]} of {o.wrong[1]} candidates gave a wrong "
                                   f"output in this search{which}"))
        if o.failed_candidates:
            lines.append(printable(f"skipped: {o.job.label()}: {o.failed_candidates} of {o.wrong[1]} candidates failed "
                                   f"where they ran (the artifact written records each one's error)"))
        if o.unchecked and o.status == "tuned":
            lines.append(printable(f"unchecked: {o.job.label()}: {o.unchecked}"))
    for o in report.failed:
        on = f" on {o.job.device}" if several else ""
        lines.append(printable(f"failed: {o.job.label()}{on}: {o.reason}"))
    return "\n".join(lines)
