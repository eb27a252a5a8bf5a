"""`flytune diff A B`: identities added, removed or with a changed winner between two bundles
(audit.inspection).
"""
from __future__ import annotations

import sys

from ..core.errors import printable
from .output import EXIT_OK, EXIT_VIOLATIONS, JSON_FORMAT, dump


def add_command(command) -> None:
    d = command("diff", "identities added, removed or with a changed winner between two bundles",
                "0 compared, 1 A or B is missing or has violations (the diff is printed all the same), "
                "2 usage error")
    d.add_argument("old", metavar="A", help="the old bundle: wheel, sdist, directory or installed distribution")
    d.add_argument("new", metavar="B", help="the new bundle, of any kind A may be")
    d.add_argument("--json", action="store_true", help=f"machine-readable output (\"format\": {JSON_FORMAT})")


def command(args) -> int:
    from ..audit import inspection, source
    from . import render

    old, new = source.open_source(args.old), source.open_source(args.new)
    changes = inspection.diff(old, new)
    print(dump(changes) if args.json else render.render_diff(changes))
    for e in () if args.json else changes["errors"]:   # --json holds them in its document
        print(f"flytune: error: {printable(e['message'])}", file=sys.stderr)
    return EXIT_OK if old.ok and new.ok else EXIT_VIOLATIONS
