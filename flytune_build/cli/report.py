"""`flytune report SOURCE [SOURCE2] --output FILE.html`: a bundle's tuning evidence as one self-contained
page (review/): a chart per tuned shape, coverage, devices and toolchain; with two sources, the
winners that changed and by how much.

A source with violations, or one that cannot be read at all, is still reported: the page shows what
could be read and lists every error (as `flytune diff` prints its diff all the same), each error is
printed on stderr, and the exit code is 1. Nothing is written only on a usage error (exit 2: the
output is a directory, its folder does not exist, it is a SOURCE file or a *.json inside a SOURCE
directory, or it is an existing file that is not a page `report` wrote, such as a project's pyproject.toml)
or when the file cannot be written (exit 1).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..core.errors import UsageError, printable
from .output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS



def add_command(command) -> None:
    r = command("report", "write a self-contained HTML page of a bundle's tuning: charts, coverage, toolchain, "
                          "changed winners",
                "0 written, 1 a SOURCE has violations or cannot be read (the page is written all the same, "
                "listing them) or the page cannot be written, 2 usage error")
    r.add_argument("source", metavar="SOURCE",
                   help="a wheel, an sdist, an artifact directory, a project or an installed distribution")
    r.add_argument("new", nargs="?", metavar="SOURCE2",
                   help="a newer source of any kind SOURCE may be: charted, and compared with SOURCE")
    r.add_argument("--output", required=True, metavar="FILE.html", help="the page to write")
    r.add_argument("--title", type=str, help="the page's title (default: the sources)")


def command(args) -> int:
    out = Path(args.output)
    if out.is_dir() or not out.parent.is_dir():
        print(f"flytune: error: --output {printable(str(out))}: must be a file in an existing directory",
              file=sys.stderr)
        return EXIT_USAGE
    from .. import review
    from ..audit.source import open_source

    try:  # --output is a SOURCE, an artifact file in one, or a file no report wrote: refused before any reading
        review.check_output(out, [p for p in (args.source, args.new) if p is not None])
        sources = [open_source(p) for p in (args.source, args.new) if p is not None]
        review.write(out, *sources, title=args.title)  # an OutputError is main's one-line error, exit 1
    except UsageError as e:
        print(f"flytune: error: --output {e}", file=sys.stderr)
        return EXIT_USAGE
    for s in sources:
        for e in s.errors:
            print(f"flytune: error: {printable(str(e))}", file=sys.stderr)
    shown = sources[-1]
    print(f"flytune: wrote {printable(str(out))}: {len({a.kernel for a in shown.artifacts})} kernel(s), "
          f"{len(shown.artifacts)} tuned shape(s)" + (f", compared with {printable(sources[0].path)}"
                                                      if len(sources) == 2 else ""))
    return EXIT_OK if all(s.ok for s in sources) else EXIT_VIOLATIONS
