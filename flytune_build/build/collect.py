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
            paths = [p for p in matches if p.is_file()]
            for d in (p for p in matches if p.is_dir()):
                paths.extend(_walk(d))
        else:
            base = root / src
            if not base.exists():
                raise ProjectError(f"names {src!r}, which does not exist under {root}", file=file, field=field)
            paths = [base] if base.is_file() else _walk(base)
        for p in sorted(paths):
            real = p.resolve()
            if not real.is_relative_to(root):
                raise ProjectError(f"reaches {p}, which resolves outside the project root to {real} "
                                   f"(a symlink escaping the root is not allowed)", file=file, field=field)
            out.setdefault(real, p.relative_to(root) if p.is_relative_to(root) else real.relative_to(root))
    return sorted(((p, rel) for p, rel in out.items()), key=lambda t: str(t[1]))


def _walk(base: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
        dirnames.sort()
        found.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith(".json"))
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
    for path, rel in files:
        try:
            art = Artifact.load(path, canonical=True)
        except FlytuneError as e:
            e.file = str(rel)
            e.args = (e._render(),)
            state.reject(e)
            continue
        if not any(t.covers(art.device) for t in proj.targets):
            state.excluded.append((rel, art.device.spec()))
            continue
        state.artifacts.append(art)
        state.origin[id(art)] = rel
    return state
