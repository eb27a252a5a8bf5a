"""Collect artifacts from the declared sources, under the project root and for the declared targets."""
from __future__ import annotations

import gc
import os
from pathlib import Path

from ..core import artifactdir, fsutil
from ..core.artifact import Artifact
from ..core.errors import FlytuneError, ProjectError
from .reader import load
from .state import BuildState


def source_files(root: Path, sources, *, file=None, problems: list | None = None) -> list[tuple[str, str]]:
    """(real path, posix path relative to root) of every `*.json` the sources reach, sorted by the
    relative path; the walk is core.fsutil.find's: contained, loop-free, bounded. Each problem (a
    source that does not exist or runs past the bounds, a symlink escaping the root, a FIFO) is
    appended to `problems` and only what it concerns is left out; with no list, the first is raised."""
    out: dict[str, str] = {}
    for i, src in enumerate(sources):
        try:
            found = fsutil.find(root, src, suffix=".json", error=ProjectError, file=file,
                                field=f"tool.flytune.sources[{i}]")
        except FlytuneError as e:
            if problems is None:
                raise
            problems.append(e)
            continue
        if found.problems and problems is None:
            raise found.problems[0]
        if problems is not None:
            problems += found.problems
        for real, rel in found.files.items():
            if not artifactdir.within_bundle(root, rel):  # `flytune bundle --output` into a source: its output
                out.setdefault(real, rel)
    return sorted(out.items(), key=lambda t: t[1])


def collect(state: BuildState) -> BuildState:
    proj = state.project
    pyproject = proj.root / "pyproject.toml"
    problems: list[FlytuneError] = []
    files = source_files(proj.root, proj.sources, file=pyproject, problems=problems)
    for e in problems:  # each leaves out only the source or file it names
        state.reject(e)
    if not files:
        state.warnings.append("the declared sources hold no artifact: `flytune tune` writes them (on a CPU: "
                              "TRITON_INTERPRET=1 flytune tune --ranking synthetic)")
    for (path, rel), loaded in zip(files, load_all([p for p, _ in files])):
        if isinstance(loaded, FlytuneError):
            loaded.relocate(rel)
            state.reject(loaded)
            continue
        if not any(t.covers(loaded.device) for t in proj.targets):
            state.excluded.append((rel, loaded.device.spec()))
            continue
        state.artifacts.append(loaded)
        state.origin[id(loaded)] = rel
    return state


PARALLEL_FROM = 2000  # below this, starting worker processes costs more than it saves


def _load_chunk(paths: list[str]) -> list[Artifact | FlytuneError]:
    out: list[Artifact | FlytuneError] = []
    devices: dict = {}  # one object per distinct device, so results pickle small
    for p in paths:
        try:
            a = load(p)
        except FlytuneError as e:
            out.append(e)
            continue
        device = devices.setdefault(a.device, a.device)
        if device is not a.device:
            object.__setattr__(a, "device", device)
        out.append(a)
    return out


def load_all(paths: list[str]) -> list[Artifact | FlytuneError]:
    """Load and check every artifact; large collections spread over the machine's cores."""
    enabled = gc.isenabled()
    gc.disable()  # thousands of new, acyclic objects: collection passes would find nothing to free
    try:
        return _load_all(paths)
    finally:
        if enabled:
            gc.enable()


def _load_all(paths: list[str]) -> list[Artifact | FlytuneError]:
    workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 16)
    if len(paths) < PARALLEL_FROM or workers < 2:
        return _load_chunk(paths)
    from concurrent.futures import ProcessPoolExecutor

    size = -(-len(paths) // (workers * 2))
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return [a for chunk in pool.map(_load_chunk, chunks) for a in chunk]
    except (OSError, RuntimeError):  # no process support here: load in this process
        return _load_chunk(paths)
