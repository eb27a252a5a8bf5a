"""Collect artifacts from the declared sources, under the project root and for the declared targets."""
from __future__ import annotations

import gc
import glob
import os
from pathlib import Path

from ..core.artifact import Artifact
from ..core.errors import FlytuneError, ProjectError
from .state import BuildState

_GLOB_CHARS = set("*?[")


def source_files(root: Path, sources, *, file=None) -> list[tuple[str, str]]:
    """(path, posix path relative to root) of every `*.json` the sources name, sorted by the
    relative path; a source or symlink reaching outside the root is an error."""
    root = root.resolve()
    top = str(root) + os.sep
    out: dict[str, str] = {}
    for i, src in enumerate(sources):
        field = f"tool.flytune.sources[{i}]"
        if _GLOB_CHARS & set(src):
            bases = [Path(p) for p in sorted(glob.glob(str(root / src), recursive=True))]
        else:
            base = root / src
            if not base.exists() and not base.is_symlink():
                raise ProjectError(f"names {src!r}, which does not exist under {root}", file=file, field=field)
            bases = [base]
        for base in bases:
            linked = _linked(base, root)
            if base.is_dir():
                paths = _walk(str(base), linked)
            elif base.name.endswith(".json"):
                paths = [(str(base), linked)]
            else:
                continue
            for p, link in paths:
                real = os.path.realpath(p) if link else p
                if link and not real.startswith(top):
                    raise ProjectError(f"reaches {p}, which resolves outside the project root to {real} "
                                       f"(a symlink escaping the root is not allowed)", file=file, field=field)
                out.setdefault(real, p[len(top):].replace(os.sep, "/"))
    return sorted(out.items(), key=lambda t: t[1])


def _linked(path: Path, root: Path) -> bool:
    """Whether any component between the root and `path` is a symlink (then its real path is checked)."""
    rel = path.relative_to(root)
    cur = root
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink():
            return True
    return False


def _walk(base: str, linked: bool) -> list[tuple[str, bool]]:
    """Every `*.json` under `base`, each with whether a symlink lies on its way (one scandir per folder)."""
    found, stack = [], [(base, linked)]
    while stack:
        folder, link = stack.pop()
        with os.scandir(folder) as it:
            for entry in it:
                is_link = link or entry.is_symlink()
                if entry.is_dir():
                    stack.append((entry.path, is_link))
                elif entry.name.endswith(".json") and entry.is_file():
                    found.append((entry.path, is_link))
        if len(found) > 1_000_000:
            break
    return found


def collect(state: BuildState) -> BuildState:
    proj = state.project
    pyproject = proj.root / "pyproject.toml"
    try:
        files = source_files(proj.root, proj.sources, file=pyproject)
    except FlytuneError as e:
        state.reject(e)
        return state
    if not files:
        state.warnings.append("the declared sources hold no artifact")
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
            a = Artifact.load(p, canonical=True)
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
