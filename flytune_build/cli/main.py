"""The `flytune` command: tune on the intended GPU; verify, inspect and diff bundles without one.

Exit codes: 0 clean, 1 violations (or a failed run), 2 usage error, 120 stdout closed early, 130
interrupted. Errors are one line `flytune: error: ...` on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..core.errors import FlytuneError, UsageError, printable
from ..core.version import VERSION

from .output import (EXIT_BROKEN_PIPE, EXIT_CODES, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS,
                     JSON_FORMAT, dump)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"flytune: error: {printable(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flytune", description=__doc__.splitlines()[0], epilog=EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flytune {VERSION}",
                        help="print the flytune-build version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                help="`flytune COMMAND --help` describes each")

    def command(name, help, codes):
        return sub.add_parser(name, help=help, description=help, epilog=f"exit codes: {codes}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    from . import harvest, init, merge, report, tune, upgrade, warmup

    init.add_command(command)
    tune.add_command(command)
    v = command("verify", "verify wheels, sdists, artifact directories or installed distributions",
                "0 clean, 1 violations, 2 usage error")
    v.add_argument("paths", nargs="+", metavar="PATH",
                   help="a wheel, an sdist, a project or artifact directory, or an installed distribution name")
    v.add_argument("--json", action="store_true", help=f"machine-readable report (\"format\": {JSON_FORMAT})")
    v.add_argument("--strict", action="store_true", help="toolchain drift is an error, not a warning")
    v.add_argument("--deep", action="store_true", help="import the package and check artifacts against kernels")
    v.add_argument("--execute", action="store_true", help="run each matching artifact once (GPU or interpreter)")

    i = command("inspect", "coverage matrix, key axes, toolchain and sizes of a bundle",
                "0 clean, 1 PATH has violations, 2 usage error")
    i.add_argument("path", metavar="PATH", nargs="?",
                   help="a wheel, an sdist, a directory or an installed distribution")
    i.add_argument("--installed", action="store_true",
                   help="instead of PATH: which installed bundle (owner, accepted config pack, FLYTUNE_ARTIFACT_DIR) "
                        "serves each kernel on this device")
    i.add_argument("--json", action="store_true", help=f"machine-readable output (\"format\": {JSON_FORMAT})")

    d = command("diff", "identities added, removed or with a changed winner between two bundles",
                "0 compared, 1 A or B is missing or has violations (the diff is printed all the same), "
                "2 usage error")
    d.add_argument("old", metavar="A", help="the old bundle: wheel, sdist, directory or installed distribution")
    d.add_argument("new", metavar="B", help="the new bundle, of any kind A may be")
    d.add_argument("--json", action="store_true", help=f"machine-readable output (\"format\": {JSON_FORMAT})")
    add_data_commands(command)
    merge.add_command(command)
    warmup.add_command(command)
    report.add_command(command)
    upgrade.add_command(command)
    harvest.add_command(command)
    return parser


def add_data_commands(command) -> None:
    """fmt, export, import, bundle: the commands that write files."""
    f = command("fmt", "rewrite artifact files in canonical form under their content address",
                "0 done, 1 a DIR is missing or holds an invalid artifact, 2 usage error")
    f.add_argument("paths", nargs="+", metavar="DIR", help="a directory of artifact files (*.json)")

    x = command("export", "write a bundle's or directory's artifacts in another tool's format",
                "0 written, 1 PATH has violations, 2 usage error")
    x.add_argument("path", metavar="PATH", help="a wheel, an sdist, a directory or an installed distribution")
    x.add_argument("--format", choices=("flydsl",), required=True, help="the other tool's format")
    x.add_argument("--output", required=True, help="directory to write into")

    m = command("import", "turn another tool's tuned configs into flytune artifacts (all or nothing)",
                "0 imported, 1 a file or entry is refused (nothing is written), 2 usage error")
    m.add_argument("paths", nargs="+", metavar="FILE", help="config files in the chosen format")
    m.add_argument("--format", choices=("flydsl", "vllm", "sglang"), required=True,
                   help="flydsl: FlyDSL offline configs; vllm, sglang: fused-MoE config files "
                        "(E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]].json)")
    m.add_argument("--output", required=True, help="artifact directory to write into")
    m.add_argument("--kernel", "--name", dest="kernel", metavar="NAME",
                   help="kernel name to import under (required for vllm and sglang; flydsl default: the "
                        "FlyDSL name, '-' -> '_')")
    m.add_argument("--device", metavar="SPEC", help="device of every file, as FLYTUNE_DEVICE spells it "
                   "(cuda:sm_90:132:NVIDIA H200); vllm, sglang default: from the file name's device_name")

    b = command("bundle", "write the verified bundle into a package directory, for any other build backend",
                "0 written, 1 verification failed (nothing is written), 2 usage error")
    b.add_argument("--output", required=True, metavar="DIR",
                   help="the package's source directory (e.g. src/mypkg); the bundle goes to DIR/_flytune/")
    b.add_argument("--project", default=".", help="project root holding pyproject.toml (default: .)")


def main(argv=None) -> int:
    text_streams()
    args = build_parser().parse_args(argv)
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except UsageError as e:  # the run cannot start as asked: nothing was done
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_VIOLATIONS
    except KeyboardInterrupt:
        print("flytune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return broken_pipe()
    except Exception as e:  # noqa: BLE001 - a bug or an OS error: one line, as every other failure
        print(f"flytune: error: {type(e).__name__}: {printable(str(e))}", file=sys.stderr)
        return EXIT_VIOLATIONS


def text_streams() -> None:
    """stdout and stderr write what they cannot encode as Python escapes: a path is printed whatever its
    bytes (a file name that is no UTF-8 reaches Python as lone surrogates, which a strict UTF-8 stream
    refuses with UnicodeEncodeError), and what a command prints never fails for the text it holds."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text stream of ours (an embedding replaced it)
            pass


def broken_pipe() -> int:
    """Whoever read stdout stopped (`| head`): end quietly, and point stdout at /dev/null so the
    interpreter's own last flush has nothing to complain about (pip does the same)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _tune(args) -> int:
    from . import tune

    return tune.command(args)


def _verify(args) -> int:
    from ..audit import source

    reports = [source.verify(p, strict=args.strict, deep=args.deep, execute=args.execute) for p in args.paths]
    ok = all(r.ok for r in reports)
    if args.json:
        print(dump({"ok": ok, "reports": [r.to_json() for r in reports]}))
    else:
        for r in reports:
            print(r.render())
    return EXIT_OK if ok else EXIT_VIOLATIONS


def _inspect(args) -> int:
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


def _diff(args) -> int:
    from ..audit import inspection, source
    from . import render

    old, new = source.open_source(args.old), source.open_source(args.new)
    changes = inspection.diff(old, new)
    print(dump(changes) if args.json else render.render_diff(changes))
    return EXIT_OK if old.ok and new.ok else EXIT_VIOLATIONS


def _export(args) -> int:
    from ..audit import source
    from ..runtime.adapters import flydsl

    src = source.open_source(args.path)
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
    if args.format == "flydsl":
        if args.device:
            print("flytune: error: --device applies to --format vllm and sglang (FlyDSL files name their "
                  "device)", file=sys.stderr)
            return EXIT_USAGE
        from ..interop.moe import save_all
        from ..runtime.adapters import flydsl

        arts = [flydsl.from_flydsl(p, name=args.kernel) for p in args.paths]  # all or nothing
        written, there = save_all(arts, args.output)
        print(f"flytune: imported {written} FlyDSL config(s) into {args.output}"
              + (f" ({there} already there)" if there else ""))
        return EXIT_OK
    from ..core.artifact import KERNEL_NAME, KERNEL_NAME_MAX
    from ..core.device import parse_spec
    from ..interop import moe

    if not args.kernel or not KERNEL_NAME.fullmatch(args.kernel) or len(args.kernel) > KERNEL_NAME_MAX:
        print(f"flytune: error: --format {args.format} needs --kernel NAME, a dotted Python name of at most "
              f"{KERNEL_NAME_MAX} characters (the kernel's `name`, e.g. mylib.fused_moe)", file=sys.stderr)
        return EXIT_USAGE
    device = parse_spec(args.device, source="--device") if args.device else None
    arts = moe.import_files(args.paths, args.format, args.kernel, device)  # all or nothing
    written, there = moe.save_all(arts, args.output)
    print(f"flytune: imported {written} artifact(s) of {args.kernel} from {len(args.paths)} {args.format} "
          f"file(s) into {args.output}" + (f" ({there} already there)" if there else ""))
    return EXIT_OK


def _fmt(args) -> int:
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


def _bundle(args) -> int:
    from .. import pipeline
    from ..core import bundle
    from ..core import project as project_mod
    from ..pipeline import directory

    root = Path(args.project).resolve()
    proj = project_mod.load(root)
    if proj is None:
        print(f"flytune: error: {root / 'pyproject.toml'} has no [tool.flytune] table", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.output)
    package_path = proj.package.replace(".", "/")
    if out.resolve() == root:  # the entry point names <package>._flytune: a bundle beside pyproject.toml is lost
        where = f"src/{package_path}" if (root / "src" / package_path).is_dir() else package_path
        print(f"flytune: error: --output {printable(args.output)} is the project root; the bundle goes into the "
              f"package's own directory: --output {where}", file=sys.stderr)
        return EXIT_USAGE
    state = pipeline.run(root, project=proj)  # the build's report on stderr; a failed verification raises
    if not out.resolve().as_posix().endswith("/" + package_path):
        print(f"flytune: warning: {out} is not the directory of package {state.project.package}, which the entry "
              f"point names", file=sys.stderr)
    written = directory.write(state, out)
    name, value = state.entry_point
    print(f"flytune: wrote {len(written)} file(s) to {out / bundle.DIRNAME}; declare the bundle once in "
          f"pyproject.toml:")
    print(f'[project.entry-points."{bundle.ENTRY_POINT_GROUP}"]')
    print(f'{name} = "{value}"')
    return EXIT_OK


def _init(args) -> int:
    from . import init

    return init.command(args)


def _merge(args) -> int:
    from . import merge

    return merge.command(args)


def _report(args) -> int:
    from . import report

    return report.command(args)


def _upgrade(args) -> int:
    from . import upgrade

    return upgrade.command(args)


def _harvest(args) -> int:
    from . import harvest

    return harvest.command(args)


def _warmup(args) -> int:
    from . import warmup

    return warmup.command(args)


COMMANDS = {"init": _init, "tune": _tune, "verify": _verify, "inspect": _inspect, "diff": _diff, "fmt": _fmt,
            "export": _export, "import": _import, "bundle": _bundle, "merge": _merge, "warmup": _warmup,
            "report": _report, "upgrade": _upgrade, "harvest": _harvest}


if __name__ == "__main__":
    raise SystemExit(main())
