"""`flytune inspect PATH | --installed`: a bundle's coverage, axes, toolchain and sizes, or which installed
bundle serves each kernel (audit.inspection).
"""
from __future__ import annotations

import sys

from .output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, JSON_FORMAT, dump


def add_command(command) -> None:
    i = command("inspect", "coverage matrix, key axes, toolchain and sizes of a bundle",
                "0 clean, 1 PATH has violations, 2 usage error")
    i.add_argument("path", metavar="PATH", nargs="?",
                   help="a wheel, an sdist, a directory or an installed distribution")
    i.add_argument("--installed", action="store_true",
                   help="instead of PATH: which installed bundle (owner, accepted config pack, FLYTUNE_ARTIFACT_DIR) "
                        "serves each kernel on this device")
    i.add_argument("--json", action="store_true", help=f"machine-readable output (\"format\": {JSON_FORMAT})")


def command(args) -> int:
    from ..audit import inspection, source
    from . import render

    if args.installed == (args.path is not None):
        print("flytune: error: inspect takes PATH or --installed (one of them)", file=sys.stderr)
        return EXIT_USAGE
    if args.installed:
        info = inspection.installed()
        print(dump(info) if args.json else render.render_installed(info))
        return EXIT_OK
    view = source.open_source(args.path)
    info = inspection.inspect(view)
    print(dump(info) if args.json else render.render_inspect(info))
    return EXIT_OK if not view.errors else EXIT_VIOLATIONS
