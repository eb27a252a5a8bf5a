"""`flytune export --format flydsl PATH`: a bundle's artifacts in another tool's format."""
from __future__ import annotations

import sys

from .output import EXIT_OK, EXIT_VIOLATIONS


def add_command(command) -> None:
    x = command("export", "write a bundle's or directory's artifacts in another tool's format",
                "0 written, 1 PATH has violations or DIR cannot be written (nothing is written), 2 usage error (DIR is, "
                "lies inside or holds PATH)")
    x.add_argument("path", metavar="PATH", help="a wheel, an sdist, a directory or an installed distribution")
    x.add_argument("--format", choices=("flydsl",), required=True, help="the other tool's format")
    x.add_argument("--output", required=True, metavar="DIR", help="directory to write into (apart from PATH)")


def command(args) -> int:
    from ..audit import source
    from ..core import fsutil
    from ..interop import flydsl

    src = source.open_source(args.path)
    fsutil.apart(args.output, src.reads)  # `export hip3 --output hip3`: FlyDSL files among its artifacts
    if src.errors:
        for e in src.errors:
            print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_VIOLATIONS
    written, skipped = flydsl.export(src.artifacts, args.output)
    for reason in skipped:
        print(f"skipped: {reason}")
    print(f"flytune: wrote {len(written)} FlyDSL config(s) to {args.output}, skipped {len(skipped)}")
    return EXIT_OK
