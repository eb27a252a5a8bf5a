"""Verify at package time, with no GPU: key axes, conflicts, each config the winner its provenance
records, toolchain drift, coverage; rankings mixed on one device (a synthetic artifact beside measured
ones) are a warning, as in `flytune verify` without --strict.

The rules are core.verification's, shared with `flytune verify`; schema, canonical form and content
address are checked as each file is collected. A `tune.output` the sources do not reach is an
error (a warning where `strict = false`): re-tuning there would never change the bundle. Coverage knows the kernels the project plans to tune
(`[tool.flytune.tune]` entries or its plan file), so a planned kernel with no artifact is a gap.
"""
from __future__ import annotations

from ..core import fsutil, verification
from ..core import project as project_mod
from ..core.errors import FlytuneError, ProjectError
from .state import BuildState


def verify(state: BuildState) -> BuildState:
    """Reject what breaks a rule, keep the rest; each error names the file relative to the project root."""
    found = verification.check(state.artifacts, lambda a: str(state.origin.get(id(a), a.filename)),
                               verification.Declaration.of_project(state.project), kernels=planned(state))
    state.rejected += found.errors
    state.warnings += found.warnings
    state.artifacts = found.bundled(state.artifacts)  # an earlier release's keys under the kernel's one axis set
    state.warnings += [str(e) for e in mixed(state)]
    unshipped = project_mod.unshipped_output_error(state.project)
    if unshipped is not None:  # strict: an error; otherwise dropped to a warning, as every rejection is
        state.reject(unshipped)
    return state


def mixed(state: BuildState) -> list[FlytuneError]:
    """The kept artifacts' rankings mixed on one device (core.verification.rankings), each naming its file
    relative to the project root: a warning here, a violation of `flytune verify --strict`."""
    return verification.rankings(state.artifacts, lambda a: str(state.origin.get(id(a), a.filename))).errors


def planned(state: BuildState) -> tuple[str, ...]:
    """The kernels of the project's tuning plan. A plan file the source tree lacks (an sdist that left
    it out) is a warning; one that is there and invalid is an error; a shape it repeats is a warning
    (`flytune tune` refuses it; the build tunes nothing, and releases before that rule built it)."""
    proj = state.project
    if not proj.tune_plan:
        _repeats(state, proj.tune_entries)
        return tuple(e.kernel for e in proj.tune_entries)
    try:  # the plan must be a regular file under the root: a link to /proc/self/environ is never read
        plan = fsutil.contained(proj.root, proj.tune_plan, error=ProjectError, file=proj.root / "pyproject.toml",
                                field="tool.flytune.tune.plan")
    except FlytuneError as e:
        state.reject(e)
        return ()
    if plan is None:
        state.warnings.append(f"the tuning plan {proj.tune_plan} is not in the source tree: coverage checks "
                              f"only the kernels that have artifacts")
        return ()
    try:
        entries = project_mod.load_plan(proj.root, proj.tune_plan, repeats=False)
    except FlytuneError as e:
        state.reject(e)
        return ()
    _repeats(state, entries)
    return tuple(e.kernel for e in entries)


def _repeats(state: BuildState, entries) -> None:
    try:
        project_mod.check_repeats(entries)
    except FlytuneError as e:
        state.warnings.append(f"{e} (`flytune tune` refuses it)")
