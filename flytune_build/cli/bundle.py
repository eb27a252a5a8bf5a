"""`flytune bundle --output DIR`: the verified bundle written into a package directory, for any other build
backend (pipeline.directory).
"""
from __future__ import annotations

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
