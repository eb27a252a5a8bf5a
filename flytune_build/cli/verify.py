"""`flytune verify PATH...`: wheels, sdists, directories or installed distributions, judged by the build's
rules (audit.source).
"""
from __future__ import annotations

from . import render
from .output import EXIT_OK, EXIT_VIOLATIONS, JSON_FORMAT, dump


def add_command(command) -> None:
    v = command("verify", "verify wheels, sdists, artifact directories or installed distributions",
                "0 clean, 1 violations, 2 usage error")
    v.add_argument("paths", nargs="+", metavar="PATH",
                   help="a wheel, an sdist, a project or artifact directory, or an installed distribution name")
    v.add_argument("--json", action="store_true", help=f"machine-readable report (\"format\": {JSON_FORMAT})")
    v.add_argument("--strict", action="store_true", help="toolchain drift, mixed rankings and an empty bundle are errors, not warnings")
    v.add_argument("--deep", action="store_true", help="import the package and check artifacts against kernels")
    v.add_argument("--execute", action="store_true", help="run each matching artifact once (GPU or interpreter)")


def command(args) -> int:
    from ..audit import source

    reports = [source.verify(p, strict=args.strict, deep=args.deep, execute=args.execute) for p in args.paths]
    ok = all(r.ok for r in reports)
    if args.json:
        print(dump({"ok": ok, "reports": [r.to_json() for r in reports]}))
    else:
        for r in reports:
            print(render.render_verify(r))
    return EXIT_OK if ok else EXIT_VIOLATIONS
