"""PEP 517 / PEP 660 build backend: setuptools' `build_meta`, plus the tuned-config bundle.

`build-backend = "flytune_build.backend"`. Without `[tool.flytune]` every hook is setuptools' own.
With it, the wheel hooks collect -> verify -> assemble (beside setuptools' build, in a forked
process on Linux), add the bundle and its entry point, and make the wheel reproducible. setuptools
writes into a private directory: a failed verification leaves no wheel in the wheel directory.
"""
from __future__ import annotations

import os
import sys
import tempfile
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
    proj = _project()
    if proj is None:  # no [tool.flytune]: setuptools' own build, untouched
        return build(wheel_directory, config_settings, metadata_directory)
    pending = _Pending(proj)  # collect -> verify -> assemble, beside setuptools' build where it can
    Path(wheel_directory).mkdir(parents=True, exist_ok=True)
    # setuptools writes into a private directory: a failed verification leaves no wheel behind
    with tempfile.TemporaryDirectory(prefix=".flytune-", dir=wheel_directory) as tmp:
        name = build(tmp, config_settings, metadata_directory)
        state = pending.result()
        from .build import assemble, wheel
        from .bundle import ENTRY_POINT_GROUP

        if editable:  # the package is imported from the source tree: keep the bundle out of its way
            assemble.relocate_for_editable(state)
        prefix = state.project.package.replace(".", "/") + "/_flytune/"
        wheel.rewrite(Path(tmp) / name, state.files, (ENTRY_POINT_GROUP, *state.entry_point), drop_prefix=prefix)
        os.replace(Path(tmp) / name, Path(wheel_directory) / name)
    return name


def _project():
    from . import project

    return _or_exit(project.load, ".")


def _run():
    from . import build

    return _or_exit(build.run, ".")


def _or_exit(step, *args):
    from .errors import FlytuneError

    try:
        return step(*args)
    except FlytuneError as e:
        _exit(e)


def _exit(error) -> None:
    """A clear message and a non-zero exit, not a traceback."""
    print(f"flytune: error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


class _Pending:
    """The bundle's collect -> verify -> assemble, in a forked process while setuptools builds the
    wheel in this one: two independent jobs, so on two cores a build costs the longer of them
    rather than their sum. Where forking is not safe (not Linux, or threads running), or the child
    gives no answer, it runs here instead; errors read the same either way."""

    def __init__(self, project):
        import threading

        self._project = project
        self._state = None
        self._proc = None
        if not (sys.platform.startswith("linux") and threading.active_count() == 1):
            self._state = _run()
            return
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        sys.stdout.flush()
        sys.stderr.flush()
        self._proc = ctx.Process(target=_bundle_in_child, args=(send,))
        self._proc.start()
        send.close()

    def result(self):
        if self._proc is None:
            return self._state
        try:
            answer = self._recv.recv()
        except (EOFError, OSError):
            answer = None
        self._proc.join()
        if answer is None or answer[0] == "crash":  # the child died or broke: do it here, in the open
            return _run()
        sys.stderr.write(answer[-1])  # the build report, as an inline build prints it
        sys.stderr.flush()
        if answer[0] == "error":
            _exit(answer[1])
        from .build import BuildState

        state = BuildState(self._project)
        state.files, state.entry_point = answer[1], answer[2]
        return state


def _bundle_in_child(send) -> None:
    import io

    from . import build
    from .errors import FlytuneError

    out = io.StringIO()
    try:
        state = build.run(".", out=out)
        send.send(("ok", state.files, state.entry_point, out.getvalue()))
    except FlytuneError as e:
        send.send(("error", e, out.getvalue()))
    except BaseException as e:  # noqa: BLE001 - reported by re-running in the parent
        send.send(("crash", repr(e), out.getvalue()))
    finally:
        send.close()


def _with_entry_point(prepare, metadata_directory, config_settings, editable=False):
    name = prepare(metadata_directory, config_settings)
    proj = _project()
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
