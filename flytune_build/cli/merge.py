"""`flytune merge DIR... --output OUT`: the arguments of `store.merge.merge`, and its account."""
from __future__ import annotations

import sys

from ..store.merge import PREFER
from .output import EXIT_OK, EXIT_VIOLATIONS


def add_command(command) -> None:
    m = command("merge", "the union of artifact directories tuned on different machines",
                "0 merged, 1 conflicting winners (nothing written) or an invalid artifact, 2 usage error")
    m.add_argument("dirs", nargs="+", metavar="DIR", help="a directory of artifact files (*.json)")
    m.add_argument("--output", required=True, metavar="OUT",
                   help="the merged directory: new, empty, or one of the DIRs")
    m.add_argument("--prefer", choices=PREFER, help="decide conflicts: faster (lower winner time in its own "
                   "provenance) or newer (later provenance.created)")


def command(args) -> int:
    from ..store.merge import merge

    report = merge(args.dirs, args.output, prefer=args.prefer)
    for found, why in report.conflicts:
        a = found[0].artifact
        print(f"conflict: {a.kernel} {dict(a.key)} on {a.device} ({why}):")
        for f in found:
            print(f"  {f.describe()}")
    if report.conflicts:
        print(f"flytune: error: {len(report.conflicts)} identity(ies) with different winners; nothing written "
              f"(decide with --prefer {'|'.join(PREFER)})", file=sys.stderr)
        return EXIT_VIOLATIONS
    for keep, found, why in report.decided:
        print(f"kept {keep.path} over {', '.join(str(f.path) for f in found if f is not keep)} ({why})")
    print(f"flytune: merged {len(report.chosen)} artifact(s) from {len(args.dirs)} directory(ies) into "
          f"{args.output} ({report.duplicates} duplicate(s), {len(report.decided)} conflict(s) decided by --prefer)")
    return EXIT_OK
