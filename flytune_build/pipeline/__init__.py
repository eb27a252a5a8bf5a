"""The build pipeline: one `BuildState` flows through collect -> verify -> assemble.

Nothing here imports torch or triton: pre-tuned wheels are built on machines without them.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..core import project as project_mod
from ..core.errors import BuildFailure
from . import assemble, collect, report, verify
from .state import BuildState

__all__ = ["BuildFailure", "BuildState", "run"]


def run(root: str | Path = ".", *, out=sys.stderr, project: project_mod.Project | None = None) -> BuildState | None:
    """Collect, verify and assemble the project's bundle; None when it has no `[tool.flytune]`.

    `project`, when given, is the already loaded `[tool.flytune]` of `root`."""
    proj = project or project_mod.load(root)
    if proj is None:
        return None
    state = verify.verify(collect.collect(BuildState(proj)))
    report.print_report(state, out)
    if state.rejected:
        if proj.strict:
            lines = "\n".join(f"  - {e}" for e in state.rejected)
            raise BuildFailure(f"{len(state.rejected)} problem(s) in the tuned artifacts; no wheel was written "
                               f"(set tool.flytune.strict = false to drop them with a warning instead):\n{lines}",
                               file=proj.root / "pyproject.toml")
        for e in state.rejected:
            print(f"flytune: warning: dropped: {e}", file=out)
    return assemble.assemble(state)
