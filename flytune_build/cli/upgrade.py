"""`flytune upgrade DIR`: the argument of `store.upgrade.upgrade`, and its account."""
from __future__ import annotations

import sys

from ..core.errors import printable
from .output import EXIT_OK, EXIT_VIOLATIONS


def add_command(command) -> None:
    u = command("upgrade", "rewrite an artifact directory several releases wrote under each kernel's one axis set",
                "0 upgraded (or nothing to do), 1 an invalid artifact or a conflict (nothing written), 2 usage error")
    u.add_argument("dir", metavar="DIR", help="a directory of artifact files (*.json), read with every folder below it")


def command(args) -> int:
    from ..store.upgrade import upgrade

    report = upgrade(args.dir)
    for line in report.actions:
        print(line)
    for e in report.errors:
        print(f"flytune: error: {printable(str(e))}", file=sys.stderr)
    if not report.ok:
        return EXIT_VIOLATIONS
    print(f"flytune: upgraded {len(report.actions)} of {report.files} artifact(s) in {printable(str(args.dir))}")
    return EXIT_OK
