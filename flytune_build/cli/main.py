"""The `flytune` command: tune on the intended GPU; verify, inspect and diff bundles without one.

Exit codes: 0 clean, 1 violations (or a failed run), 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core import settings
from ..core.errors import FlytuneError

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"flytune: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def main(argv=None) -> int:
    parser = _Parser(prog="flytune", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("tune", help="search a tuning plan on this device and write artifacts")
    t.add_argument("--project", default=".", help="project root holding pyproject.toml (default: .)")
    t.add_argument("--plan", help="a plan TOML file (default: [tool.flytune.tune])")
    t.add_argument("--output", help="artifact directory (default: tool.flytune.tune.output)")
    t.add_argument("--kernel", action="append", help="tune only this kernel (repeatable)")
    t.add_argument("--ranking", choices=("measured", "synthetic"), default=None,
                   help="synthetic: deterministic ranking, never a measurement (interpreter/CI artifacts)")
    t.add_argument("--no-resume", action="store_true", help="re-tune entries finished by an earlier run")
    t.add_argument("--allow-ci", action="store_true", help="run even where CI is set")
    t.add_argument("--no-progress", action="store_true")

    v = sub.add_parser("verify", help="verify wheels, sdists, artifact directories or installed distributions")
    v.add_argument("paths", nargs="+", metavar="PATH")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--strict", action="store_true", help="toolchain drift is an error, not a warning")
    v.add_argument("--deep", action="store_true", help="import the package and check artifacts against kernels")
    v.add_argument("--execute", action="store_true", help="run each matching artifact once (GPU or interpreter)")

    i = sub.add_parser("inspect", help="coverage matrix, key axes, toolchain and sizes of a bundle")
    i.add_argument("path", metavar="PATH")
    i.add_argument("--json", action="store_true")

    d = sub.add_parser("diff", help="identities added, removed or with a changed winner between two bundles")
    d.add_argument("old", metavar="A")
    d.add_argument("new", metavar="B")
    d.add_argument("--json", action="store_true")

    x = sub.add_parser("export", help="write a bundle's or directory's artifacts in another tool's format")
    x.add_argument("path", metavar="PATH")
    x.add_argument("--format", choices=("flydsl",), required=True)
    x.add_argument("--output", required=True, help="directory to write into")

    m = sub.add_parser("import", help="turn another tool's offline configs into flytune artifacts")
    m.add_argument("paths", nargs="+", metavar="FILE")
    m.add_argument("--format", choices=("flydsl",), required=True)
    m.add_argument("--output", required=True, help="artifact directory to write into")
    m.add_argument("--name", help="kernel name to import under (default: the FlyDSL name, '-' -> '_')")

    f = sub.add_parser("fmt", help="rewrite artifact files in canonical form under their content address")
    f.add_argument("paths", nargs="+", metavar="DIR")

    args = parser.parse_args(argv)
    try:
        return {"tune": _tune, "verify": _verify, "inspect": _inspect, "diff": _diff, "fmt": _fmt,
                "export": _export, "import": _import}[args.command](args)
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_VIOLATIONS
    except KeyboardInterrupt:
        print("flytune: interrupted", file=sys.stderr)
        return 130


def _tune(args) -> int:
    if settings.current().ci and not args.allow_ci:
        print("flytune: error: refusing to tune where CI is set: shared runners do not choose winners "
              "(tune on the intended GPU; pass --allow-ci to override)", file=sys.stderr)
        return EXIT_USAGE
    from ..core import project as project_mod
    from . import tune

    root = Path(args.project).resolve()
    proj = project_mod.load(root)
    if proj is None:
        print(f"flytune: error: {root / 'pyproject.toml'} has no [tool.flytune] table", file=sys.stderr)
        return EXIT_USAGE
    plan = Path(args.plan).resolve() if args.plan else proj.tune_plan  # --plan is relative to the cwd
    entries = project_mod.load_plan(root, plan) if plan else proj.tune_entries
    if args.kernel:
        entries = tuple(e for e in entries if e.kernel in args.kernel)
    if not entries:
        print("flytune: error: the tuning plan is empty (declare [tool.flytune.tune] or pass --plan)",
              file=sys.stderr)
        return EXIT_USAGE
    import time

    start = time.perf_counter()
    results = tune.run(proj, entries, output=Path(args.output).resolve() if args.output else None,
                       resume=not args.no_resume, progress=not args.no_progress, ranking=args.ranking)
    print(tune.summary(results))
    tuned = sum(r.status == "tuned" for r in results)
    print(f"flytune: {tuned} tuned, {sum(r.status == 'resumed' for r in results)} resumed, "
          f"in {time.perf_counter() - start:.1f} s")
    return EXIT_OK


def _verify(args) -> int:
    from . import audit

    reports = [audit.verify(p, strict=args.strict, deep=args.deep, execute=args.execute) for p in args.paths]
    ok = all(r.ok for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "reports": [r.to_json() for r in reports]}, indent=2, sort_keys=True))
    else:
        for r in reports:
            print(r.render())
    return EXIT_OK if ok else EXIT_VIOLATIONS


def _inspect(args) -> int:
    from . import audit

    view = audit.open_source(args.path)
    info = audit.inspect(view)
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else audit.render_inspect(info))
    return EXIT_OK if not view.errors else EXIT_VIOLATIONS


def _diff(args) -> int:
    from . import audit

    changes = audit.diff(audit.open_source(args.old), audit.open_source(args.new))
    print(json.dumps(changes, indent=2, sort_keys=True) if args.json else audit.render_diff(changes))
    return EXIT_OK


def _export(args) -> int:
    from ..runtime.adapters import flydsl
    from . import audit

    src = audit.open_source(args.path)
    if src.errors:
        for e in src.errors:
            print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_VIOLATIONS
    written, skipped = flydsl.export(src.artifacts, args.output)
    for reason in skipped:
        print(f"skipped: {reason}")
    print(f"flytune: wrote {len(written)} FlyDSL config(s) to {args.output}, skipped {len(skipped)}")
    return EXIT_OK


def _import(args) -> int:
    from ..runtime.adapters import flydsl

    arts = [flydsl.from_flydsl(p, name=args.name) for p in args.paths]  # all or nothing
    for a in arts:
        print(f"imported {a.save(args.output)}")
    return EXIT_OK


def _fmt(args) -> int:
    from ..core.artifact import Artifact

    changed = 0
    for d in args.paths:
        for path in sorted(Path(d).glob("*.json")):
            from ..core.artifact import read_capped
            from ..core.errors import ArtifactError

            art = Artifact.from_bytes(read_capped(path, ArtifactError), file=path, check_name=False)
            data = art.to_bytes()
            target = path.with_name(art.filename)
            if target != path or path.read_bytes() != data:
                art.save(path.parent)
                if target != path:
                    path.unlink()
                changed += 1
                print(f"rewrote {path} -> {target.name}")
    print(f"flytune: {changed} file(s) rewritten")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
