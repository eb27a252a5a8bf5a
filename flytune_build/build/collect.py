"""Collect artifacts from the declared sources, under the project root and for the declared targets."""
from __future__ import annotations

import glob
import os
from pathlib import Path

from ..artifact import Artifact
from ..errors import FlytuneError, ProjectError
from . import BuildState

_GLOB_CHARS = set("*?[")


def source_files(root: Path, sources, *, file=None) -> list[tuple[Path, Path]]:
    """(path, path relative to root) of every `*.json` the sources name; escapes are errors."""
    root = root.resolve()
    out: dict[Path, Path] = {}
    for i, src in enumerate(sources):
        field = f"tool.flytune.sources[{i}]"
        if _GLOB_CHARS & set(src):
            matches = [Path(p) for p in glob.glob(str(root / src), recursive=True)]
            bases = matches
        else:
            base = root / src
            if not base.exists() and not base.is_symlink():
                raise ProjectError(f"names {src!r}, which does not exist under {root}", file=file, field=field)
            bases = [base]
        paths = []
        for base in bases:
            linked = _linked(base, root)
            if base.is_dir():
                paths.extend(_walk(base, linked))
            elif base.name.endswith(".json"):
                paths.append((base, linked))
        for p, linked in sorted(paths):
            real = Path(os.path.realpath(p)) if linked else p
            if linked and not real.is_relative_to(root):
                raise ProjectError(f"reaches {p}, which resolves outside the project root to {real} "
                                   f"(a symlink escaping the root is not allowed)", file=file, field=field)
            out.setdefault(real, p.relative_to(root))
    return sorted(((p, rel) for p, rel in out.items()), key=lambda t: str(t[1]))


def _linked(path: Path, root: Path) -> bool:
    """Whether any component between the root and `path` is a symlink (then its real path is checked)."""
    rel = path.relative_to(root)
    cur = root
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink():
            return True
    return False


def _walk(base: Path, linked: bool) -> list[tuple[Path, bool]]:
    """Every `*.json` under `base`, each with whether a symlink lies on its way (one scandir per folder)."""
    found, stack = [], [(str(base), linked)]
    while stack:
        folder, link = stack.pop()
        with os.scandir(folder) as it:
            for entry in sorted(it, key=lambda e: e.name):
                is_link = link or entry.is_symlink()
                if entry.is_dir():
                    stack.append((entry.path, is_link))
                elif entry.name.endswith(".json") and entry.is_file():
                    found.append((Path(entry.path), is_link))
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
            loaded.file = str(rel)
            loaded.args = (loaded._render(),)
            state.reject(loaded)
            continue
        if not any(t.covers(loaded.device) for t in proj.targets):
            state.excluded.append((rel, loaded.device.spec()))
            continue
        state.artifacts.append(loaded)
        state.origin[id(loaded)] = rel
    return state


PARALLEL_FROM = 2000  # below this, starting worker processes costs more than it saves


def _load(path: Path) -> Artifact | FlytuneError:
    try:
        return Artifact.load(path, canonical=True)
    except FlytuneError as e:
        return e


def _load_chunk(paths: list[Path]) -> list[Artifact | FlytuneError]:
    return [_load(p) for p in paths]


def load_all(paths: list[Path]) -> list[Artifact | FlytuneError]:
    """Load and check every artifact; large collections spread over the machine's cores."""
    workers = min(os.cpu_count() or 1, 16)
    if len(paths) < PARALLEL_FROM or workers < 2:
        return _load_chunk(paths)
    from concurrent.futures import ProcessPoolExecutor

    size = -(-len(paths) // (workers * 4))
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return [a for chunk in pool.map(_load_chunk, chunks) for a in chunk]
    except (OSError, RuntimeError):  # no process support here: load in this process
        return _load_chunk(paths)
