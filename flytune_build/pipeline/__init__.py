"""The build pipeline: one `BuildState` flows through collect -> verify -> assemble.

Nothing here imports torch or triton: pre-tuned wheels are built on machines without them.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..core import project as project_mod
from ..core.errors import BuildFailure, NoTable
from . import assemble, collect, report, verify
from .state import BuildState

__all__ = ["BuildFailure", "BuildState", "load", "missing", "run"]


def run(root: str | Path = ".", *, out=sys.stderr, project: project_mod.Project | None = None) -> BuildState | None:
    """Collect, verify and assemble the project's bundle; None when it has no `[tool.flytune]`.

    `project`, when given, is the already loaded `[tool.flytune]` of `root`. A strict build fails on
    any problem; `strict = false` drops what it may with a warning, but never a problem of the tuning
    plan (dropping the plan would stop coverage checking its kernels)."""
    proj = project or load(root)
    if proj is None:
        return None
    state = verify.verify(collect.collect(BuildState(proj)))
    report.print_report(state, out)
    binding = state.rejected if proj.strict else [e for e in state.rejected if state.where(e) == "plan"]
    if binding:
        raise BuildFailure(failure(state, binding), file=proj.root / "pyproject.toml")
    for e in state.rejected:
        print(f"flytune: warning: dropped: {e}", file=out)
    return assemble.assemble(state)


def load(root: str | Path) -> project_mod.Project | None:
    """The project's `[tool.flytune]` (core.project.load), None where it has none. A ProjectError where it
    has none but a table within a typo of it (`[tool.flytun]`, `[tools.flytune]`): a build would ship no
    bundle and say nothing."""
    proj = project_mod.load(root)
    if proj is None:
        close = project_mod.misnamed(project_mod.read_pyproject(Path(root)))
        if close:
            raise NoTable("is not a table flytune reads (did you mean `tool.flytune`?), and there is no "
                          "[tool.flytune]: the build would bundle nothing; rename it [tool.flytune], or run "
                          "`flytune init` to write one", file=Path(root).resolve() / "pyproject.toml", field=close)
    return proj


def missing(root: str | Path) -> NoTable:
    """What a command that needs `[tool.flytune]` says where the project has none (nor one misnamed)."""
    return NoTable("has no [tool.flytune] table: run `flytune init` to write one (it finds the package's "
                   "kernels and writes the table, a tuning plan and its setups)",
                   file=Path(root).resolve() / "pyproject.toml")


def failure(state: BuildState, problems=None) -> str:
    """A build's refusal of `problems` (default: everything rejected): where they are (the declaration:
    `[tool.flytune]`, the tuning plan; or the tuned artifacts), then one line per problem. Only bad
    artifacts may be dropped (`strict = false`): the fix says so only where some are."""
    problems = state.rejected if problems is None else problems
    proj = state.project
    places = [state.where(e) for e in problems]
    declared, plan, artifacts = (places.count(p) for p in ("declaration", "plan", "artifacts"))
    where = [(declared, "[tool.flytune]"), (plan, f"the tuning plan {proj.tune_plan}"),
             (artifacts, "the tuned artifacts")]
    where = [f"{n} in {place}" for n, place in where if n]
    where[0] = where[0].replace(" in ", " problem(s) in ", 1)  # the noun once: "1 problem(s) in X and 2 in Y"
    fix = " (set tool.flytune.strict = false to drop bad artifacts with a warning instead)" \
        if artifacts and proj.strict else ""
    lines = "\n".join(f"  - {e}" for e in problems)
    return f"{' and '.join(where)}; no wheel was written{fix}:\n{lines}"
