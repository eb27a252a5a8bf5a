"""The build pipeline: one `BuildState` flows through collect -> verify -> assemble.

Nothing here imports torch or triton: pre-tuned wheels are built on machines without them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import Artifact
from ..errors import FlytuneError
from ..project import Project


class BuildFailure(FlytuneError):
    """Verification failed in strict mode: no wheel is written."""


@dataclass
class BuildState:
    """What was collected, what was rejected and why, and what gets written."""
    project: Project
    artifacts: list[Artifact] = field(default_factory=list)       # kept
    origin: dict[int, Path] = field(default_factory=dict)         # id(artifact) -> file it came from
    excluded: list[tuple[Path, str]] = field(default_factory=list)  # other devices: (file, device)
    rejected: list[FlytuneError] = field(default_factory=list)    # errors: each names file, field, rule
    warnings: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)         # wheel path -> bytes
    entry_point: tuple[str, str] | None = None                    # (name, value) in flytune.bundles

    def reject(self, error: FlytuneError) -> None:
        self.rejected.append(error)


def run(root: str | Path = ".", *, out=sys.stderr) -> BuildState | None:
    """Collect, verify and assemble the project's bundle; None when it has no `[tool.flytune]`."""
    from .. import project as project_mod
    from . import assemble, collect, report, verify

    proj = project_mod.load(root)
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
