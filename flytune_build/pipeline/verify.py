"""Verify at package time, with no GPU: key axes, conflicts, toolchain drift, coverage.

The rules are core.verification's, shared with `flytune verify`; schema, canonical form and content
address are checked as each file is collected.
"""
from __future__ import annotations

from ..core import verification
from .state import BuildState


def verify(state: BuildState) -> BuildState:
    """Reject what breaks a rule, keep the rest; each error names the file relative to the project root."""
    found = verification.check(state.artifacts, lambda a: str(state.origin.get(id(a), a.filename)),
                               verification.Declaration.of_project(state.project))
    state.rejected += found.errors
    state.warnings += found.warnings
    state.artifacts = found.kept(state.artifacts)
    return state
