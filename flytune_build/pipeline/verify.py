"""Verify at package time, with no GPU: names, key axes, conflicts, coverage, toolchain drift.

Schema, canonical form and content address are checked as each file is collected.
"""
from __future__ import annotations

from collections import defaultdict

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..core.artifact import Artifact
from ..core.errors import ArtifactError, ProjectError
from .state import BuildState


def verify(state: BuildState) -> BuildState:
    proj = state.project
    files = {id(a): str(state.origin.get(id(a), a.filename)) for a in state.artifacts}
    bad: set[int] = set()

    by_kernel: dict[str, list[Artifact]] = defaultdict(list)
    for a in state.artifacts:
        by_kernel[a.kernel].append(a)

    # one key-axis set per kernel: the majority set is the kernel's, every other file is named
    for kernel, arts in sorted(by_kernel.items()):
        counts: dict[tuple, int] = defaultdict(int)
        for a in arts:
            counts[a.key_axes()] += 1
        if len(counts) > 1:
            main = max(counts, key=lambda k: (counts[k], k))
            for a in arts:
                if a.key_axes() != main:
                    state.reject(ArtifactError(f"has key axes {list(a.key_axes())}, but kernel {kernel} uses "
                                               f"{list(main)} in {counts[main]} other artifact(s)",
                                               file=files[id(a)], field="key"))
                    bad.add(id(a))

    # one config per identity
    seen: dict[str, Artifact] = {}
    for a in state.artifacts:
        first = seen.get(a.address)
        if first is None:
            seen[a.address] = a
        elif first.config != a.config:
            state.reject(ArtifactError(f"conflicts with {files[id(first)]}: same identity (kernel, key, device), "
                                       f"different config ({first.config} vs {a.config})",
                                       file=files[id(a)], field="config"))
            bad.add(id(a))
            bad.add(id(first))
        else:
            bad.add(id(a))  # an exact duplicate: keep the first silently
            state.warnings.append(f"{files[id(a)]} duplicates {files[id(first)]}; kept once")

    # toolchain drift: tuned with a Triton outside the declared range
    if proj.triton:
        spec = SpecifierSet(proj.triton)
        within: dict[str, bool] = {}  # tuned version -> inside the range (a bundle holds few versions)
        for a in state.artifacts:
            tuned = (a.provenance or {}).get("triton")
            if tuned is None:
                state.reject(ArtifactError(f"is required when tool.flytune.triton = {proj.triton!r} is declared",
                                           file=files[id(a)], field="provenance.triton"))
                bad.add(id(a))
                continue
            ok = within.get(tuned)
            if ok is None:
                try:
                    ok = within[tuned] = spec.contains(Version(tuned), prereleases=True)
                except InvalidVersion:
                    ok = within[tuned] = False
            if not ok:
                state.reject(ArtifactError(f"is {tuned}, outside the declared Triton range {proj.triton!r} "
                                           f"(toolchain drift: re-tune, or widen tool.flytune.triton)",
                                           file=files[id(a)], field="provenance.triton"))
                bad.add(id(a))

    state.artifacts = [a for a in state.artifacts if id(a) not in bad]
    _coverage(state)
    return state


def _coverage(state: BuildState) -> None:
    proj = state.project
    if proj.coverage == "none":
        return
    if not state.artifacts:
        state.reject(ProjectError("is not met: the sources hold no artifact for any declared target "
                                  "(set coverage = \"none\" to build without tuned configs)",
                                  file=proj.root / "pyproject.toml", field="tool.flytune.coverage"))
        return
    kernels = sorted({a.kernel for a in state.artifacts}) if proj.coverage == "all" else list(proj.coverage)
    pyproject = proj.root / "pyproject.toml"
    for kernel in kernels:
        for i, t in enumerate(proj.targets):
            if not any(a.kernel == kernel and t.covers(a.device) for a in state.artifacts):
                state.reject(ProjectError(f"is not met: kernel {kernel} has no artifact for target {t.label()} "
                                          f"(tool.flytune.targets[{i}])", file=pyproject,
                                          field="tool.flytune.coverage"))
