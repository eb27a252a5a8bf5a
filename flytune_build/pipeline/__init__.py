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
            raise BuildFailure(failure(state), file=proj.root / "pyproject.toml")
        for e in state.rejected:
            print(f"flytune: warning: dropped: {e}", file=out)
    return assemble.assemble(state)


def failure(state: BuildState) -> str:
    """A strict build's refusal: what is wrong where (the declaration or the artifacts), then one line
    per problem."""
    pyproject = str(state.project.root / "pyproject.toml")
    declared = sum(e.file == pyproject for e in state.rejected)
    artifacts = len(state.rejected) - declared
    where = [f"{declared} problem(s) in [tool.flytune]"] if declared else []
    where += [f"{artifacts} in the tuned artifacts"] if artifacts else []
    fix = (" (set tool.flytune.strict = false to drop bad artifacts with a warning instead)" if artifacts else "")
    lines = "\n".join(f"  - {e}" for e in state.rejected)
    return f"{' and '.join(where)}; no wheel was written{fix}:\n{lines}"
