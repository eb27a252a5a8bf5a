"""The bundle wrapped around a build backend's own hooks (setuptools' today).

Each function takes the backend's hook as an argument: this module imports no backend. A failure
is one line on stderr and exit status 1, never a traceback; the backend writes into a private
directory, so a failed verification leaves no wheel in the wheel directory.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ..core import bundle
from ..core import project as project_mod
from ..core.errors import FlytuneError
from . import assemble, collect, run, sdist, wheel
from .process import BackgroundBundle


def build_wheel(build, wheel_directory, config_settings, metadata_directory, *, editable: bool = False) -> str:
    proj = _or_exit(project_mod.load, ".")
    if proj is None:  # no [tool.flytune]: the backend's own build, untouched
        return build(wheel_directory, config_settings, metadata_directory)
    pending = _or_exit(BackgroundBundle, proj, run)
    Path(wheel_directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".flytune-", dir=wheel_directory) as tmp:
        name = build(tmp, config_settings, metadata_directory)
        state = _or_exit(pending.result)
        if editable:  # the package is imported from the source tree: keep the bundle out of its way
            assemble.relocate_for_editable(state)
        prefix = state.project.package.replace(".", "/") + f"/{bundle.DIRNAME}/"
        wheel.rewrite(Path(tmp) / name, state.files, (bundle.ENTRY_POINT_GROUP, *state.entry_point),
                      drop_prefix=prefix)
        os.replace(Path(tmp) / name, Path(wheel_directory) / name)
    return name


def build_sdist(build, sdist_directory, config_settings) -> str:
    state = _or_exit(run, ".")
    name = build(sdist_directory, config_settings)
    if state is not None:
        proj = state.project
        extra = {"pyproject.toml": Path("pyproject.toml").resolve()}
        for path, rel in collect.source_files(proj.root, proj.sources):
            extra[rel] = Path(path)
        if proj.tune_plan and (proj.root / proj.tune_plan).is_file():
            extra[proj.tune_plan] = proj.root / proj.tune_plan
        sdist.rewrite(Path(sdist_directory) / name, extra)
    return name


def prepare_metadata(prepare, metadata_directory, config_settings, *, editable: bool = False) -> str:
    name = prepare(metadata_directory, config_settings)
    proj = _or_exit(project_mod.load, ".")
    if proj is not None:
        ep_name = assemble.entry_point_name(proj.name, proj.package)
        value = f"{assemble.EDITABLE_ROOT}.{ep_name}" if editable else f"{proj.package}.{bundle.DIRNAME}"
        ep = Path(metadata_directory) / name / "entry_points.txt"
        old = ep.read_text("utf-8") if ep.exists() else ""
        ep.write_text(wheel.add_entry_point(old, bundle.ENTRY_POINT_GROUP, ep_name, value), "utf-8")
    return name


def _or_exit(step, *args):
    """`step(*args)`; a FlytuneError becomes a clear message and exit status 1, not a traceback."""
    try:
        return step(*args)
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
