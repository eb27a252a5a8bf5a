"""PEP 517 / PEP 660 build backend: setuptools' `build_meta`, plus the tuned-config bundle.

`build-backend = "flytune_build.backend"`. Without `[tool.flytune]` every hook is setuptools' own.
With it, the wheel hooks collect -> verify -> assemble before setuptools runs (a failure writes no
wheel), then add the bundle and its entry point and make the wheel reproducible.
"""
from __future__ import annotations

import sys
from pathlib import Path

from setuptools import build_meta as _setuptools

# flytune's own modules load inside the hooks that need them: a frontend runs each hook in a fresh
# process, and the get_requires hooks need none of them

get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _with_bundle(_setuptools.build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _with_bundle(_setuptools.build_editable, wheel_directory, config_settings, metadata_directory,
                        editable=True)


def build_sdist(sdist_directory, config_settings=None):
    state = _run()
    name = _setuptools.build_sdist(sdist_directory, config_settings)
    if state is not None:
        from .build import collect, sdist

        extra = {"pyproject.toml": Path("pyproject.toml").resolve()}
        for path, rel in collect.source_files(state.project.root, state.project.sources):
            extra[rel] = Path(path)
        plan = state.project.tune_plan
        if plan and (state.project.root / plan).is_file():
            extra[plan] = state.project.root / plan
        sdist.rewrite(Path(sdist_directory) / name, extra)
    return name


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _with_entry_point(_setuptools.prepare_metadata_for_build_wheel, metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _with_entry_point(_setuptools.prepare_metadata_for_build_editable, metadata_directory, config_settings,
                             editable=True)


def _with_bundle(build, wheel_directory, config_settings, metadata_directory, editable=False):
    state = _run()  # fails before setuptools writes anything
    name = build(wheel_directory, config_settings, metadata_directory)
    if state is not None:
        from .build import assemble, wheel
        from .bundle import ENTRY_POINT_GROUP

        if editable:  # the package is imported from the source tree: keep the bundle out of its way
            assemble.relocate_for_editable(state)
        path = Path(wheel_directory) / name
        try:
            prefix = state.project.package.replace(".", "/") + "/_flytune/"
            wheel.rewrite(path, state.files, (ENTRY_POINT_GROUP, *state.entry_point), drop_prefix=prefix)
        except BaseException:
            path.unlink(missing_ok=True)  # never leave a half-made wheel behind
            raise
    return name


def _run():
    from . import build
    from .errors import FlytuneError

    try:
        return build.run(".")
    except FlytuneError as e:  # a clear message and a non-zero exit, not a traceback
        print(f"flytune: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _with_entry_point(prepare, metadata_directory, config_settings, editable=False):
    name = prepare(metadata_directory, config_settings)
    from . import project
    from .errors import FlytuneError

    try:
        proj = project.load(".")
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    if proj is not None:
        from .build.assemble import EDITABLE_ROOT, entry_point_name
        from .build.wheel import add_entry_point
        from .bundle import ENTRY_POINT_GROUP

        ep_name = entry_point_name(proj.name, proj.package)
        value = f"{EDITABLE_ROOT}.{ep_name}" if editable else f"{proj.package}._flytune"
        ep = Path(metadata_directory) / name / "entry_points.txt"
        old = ep.read_text("utf-8") if ep.exists() else ""
        ep.write_text(add_entry_point(old, ENTRY_POINT_GROUP, ep_name, value), "utf-8")
    return name
