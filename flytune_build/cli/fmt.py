"""`flytune fmt DIR...`: artifact files rewritten in canonical form under their content address
(store.canonical).
"""
from __future__ import annotations

import sys

from ..core.errors import printable
from .output import EXIT_OK, EXIT_VIOLATIONS


def add_command(command) -> None:
    f = command("fmt", "rewrite artifact files in canonical form under their content address",
                "0 done, 1 a DIR is missing or holds an invalid artifact, 2 usage error")
    f.add_argument("paths", nargs="+", metavar="DIR", help="a directory of artifact files (*.json)")


def command(args) -> int:
    from ..store.canonical import fmt

    report = fmt(args.paths)
    for e in report.errors:
        print(f"flytune: error: {printable(str(e))}", file=sys.stderr)
    if report.errors:
        for line in report.actions:  # a file that changed while it was rewritten: the rest was done
            print(line)
        done = f"{len(report.actions)} file(s) rewritten" if report.actions else "nothing was rewritten"
        print(f"flytune: {len(report.errors)} problem(s); {done}", file=sys.stderr)
        return EXIT_VIOLATIONS
    for line in report.actions:
        print(line)
    print(f"flytune: {len(report.actions)} file(s) rewritten")
    return EXIT_OK
