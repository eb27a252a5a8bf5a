"""`flytune bundle --output DIR`: the verified bundle written into a package directory, for any other build
backend (pipeline.directory).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.errors import printable
from .output import EXIT_OK, EXIT_USAGE


def add_command(command) -> None:
    b = command("bundle", "write the verified bundle into a package directory, for any other build backend",
                "0 written, 1 verification failed (nothing is written), 2 usage error")
    b.add_argument("--output", required=True, metavar="DIR",
                   help="the package's source directory (e.g. src/mypkg); the bundle goes to DIR/_flytune/")
    b.add_argument("--project", default=".", help="project root holding pyproject.toml (default: .)")


def command(args) -> int:
    from .. import pipeline
    from ..core import bundle
    from ..pipeline import directory

    directory.check_output(args.output)   # inside a bundle (pkg/_flytune): refused before anything is built
    root = Path(args.project).resolve()
    proj = pipeline.load(root)
    if proj is None:
        print(f"flytune: error: {pipeline.missing(root)}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.output)
    package_path = proj.package.replace(".", "/")
    where = f"src/{package_path}" if (root / "src" / package_path).is_dir() else package_path
    if out.resolve() == root:  # the entry point names <package>._flytune: a bundle beside pyproject.toml is lost
        print(f"flytune: error: --output {printable(args.output)} is the project root; the bundle goes into the "
              f"package's own directory: --output {where}", file=sys.stderr)
        return EXIT_USAGE
    named = out.resolve().as_posix().endswith("/" + package_path)
    if not named and not os.path.lexists(out):  # a typo (`fixpkh`): a new directory no one imports; nothing written
        print(f"flytune: error: --output {printable(args.output)} does not exist, and is not named as package "
              f"{proj.package}; the bundle goes into the package's directory: --output {where}", file=sys.stderr)
        return EXIT_USAGE
    state = pipeline.run(root, project=proj)  # the build's report on stderr; a failed verification raises
    if not named:
        print(f"flytune: warning: {out} is not the directory of package {state.project.package}, which the entry "
              f"point names", file=sys.stderr)
    written = directory.write(state, out)
    name, value = state.entry_point
    print(f"flytune: wrote {len(written)} file(s) to {out / bundle.DIRNAME}; declare the bundle once in "
          f"pyproject.toml:")
    print(f'[project.entry-points."{bundle.ENTRY_POINT_GROUP}"]')
    print(f'{name} = "{value}"')
    return EXIT_OK
