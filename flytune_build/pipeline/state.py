"""`BuildState`: the one object every build stage takes and returns (hatchling's `build_data`, made a type)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.artifact import Artifact
from ..core.errors import FlytuneError
from ..core.project import Project


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

    def where(self, error: FlytuneError) -> str:
        """Where a rejected problem lies: "declaration" (pyproject.toml's `[tool.flytune]`), "plan" (the
        tuning plan file) or "artifacts" (the tuned artifacts, the only ones `strict = false` may drop)."""
        proj, file = self.project, error.file
        if file is not None and os.path.normpath(file) == os.path.normpath(proj.root / "pyproject.toml"):
            return "declaration"
        if proj.tune_plan and file is not None and \
                os.path.normpath(file) == os.path.normpath(proj.root / proj.tune_plan):
            return "plan"
        return "artifacts"
