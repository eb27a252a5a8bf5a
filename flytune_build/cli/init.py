"""`flytune init`: the arguments of `pipeline.scaffold`, and what it did and what comes next."""
from __future__ import annotations

from ..core.errors import printable


def add_command(command) -> None:
    i = command("init", "configure an existing package: [tool.flytune], a tuning plan of the kernels its source "
                "declares, setups to fill in",
                "0 written, 1 something is in the way or a write failed (nothing is written: what was "
                "written is undone), 2 usage error")
    i.add_argument("root", nargs="?", metavar="DIR", help="the project root, as --project")
    i.add_argument("--project", default=None, help="project root holding pyproject.toml (default: .)")
    i.add_argument("--package", help="the package whose kernels to tune (default: the one package of the project)")
    i.add_argument("--target", dest="targets", action="append", metavar="ARCH",
                   help='a device to ship for, as [tool.flytune] targets spells it (repeatable; default: '
                        '"interpreter", the CPU, or with --force the targets of the table replaced; add your '
                        'GPU\'s arch, e.g. sm_90, when you tune on it)')
    i.add_argument("--force", action="store_true",
                   help="replace an existing [tool.flytune] table and plan file (the setups module is never replaced)")


def command(args) -> int:
    from ..core.errors import UsageError
    from ..pipeline import scaffold

    if args.root is not None and args.project is not None and args.root != args.project:
        raise UsageError(f"two project roots: {args.root} and --project {args.project}: pass one")
    s = scaffold.scaffold(args.root or args.project or ".", package=args.package, targets=tuple(args.targets) if args.targets else None,
                          force=args.force)
    scaffold.write(s)
    kinds = {True: "@triton.autotune", False: "@flytune_build.autotune"}
    print(f"flytune: found {len(s.kernels)} kernel(s) in {s.package}")
    for k in s.kernels:
        print(f"  {k.name:<32} {kinds[k.adopted]:<24} {printable(str(k.file.relative_to(s.root)))}:{k.line}")
    for line in s.actions:
        print(f"flytune: {line}")
    if s.todo:
        print("then, by hand:")
        for n, line in enumerate(s.todo, 1):
            print(printable(f"  {n}. {line}"))  # a path or a kernel's name from the source: printable
    print("next:")
    for line in s.commands:
        print(f"  {line}")
    return 0
