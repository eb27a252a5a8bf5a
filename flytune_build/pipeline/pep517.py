"""The bundle wrapped around a build backend's own hooks (setuptools'; hatchling's through build_hook).

Each function takes the backend's hook as an argument: this module imports no backend. A failure
is one line on stderr and exit status 1, never a traceback; the backend writes into a private
directory beside the wheel directory, so a failed verification, or a build killed at any moment,
leaves no wheel (and no directory holding a bundle-less one) in the wheel directory. An sdist whose
rewrite fails or is interrupted (any exception, Ctrl-C too) is removed: none is left without the
artifacts it must carry.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..core import bundle, codec, fsutil, serving
from ..core.errors import ArtifactError, FlytuneError, ProjectError
from ..dist import sdist, wheel
from . import assemble, collect, load, run
from .process import BackgroundBundle


def build_wheel(build, wheel_directory, config_settings, metadata_directory, *, editable: bool = False) -> str:
    proj = or_exit(load, ".")
    if proj is None:  # no [tool.flytune]: the backend's own build, untouched, and said once
        print(f"flytune: warning: {Path('pyproject.toml').resolve()}: has no [tool.flytune] table, so this wheel "
              f"carries no tuned configs (`flytune init` writes one)", file=sys.stderr, flush=True)
        return build(wheel_directory, config_settings, metadata_directory)
    pending = or_exit(BackgroundBundle, proj, run)
    try:
        Path(wheel_directory).mkdir(parents=True, exist_ok=True)
        with staging(Path(wheel_directory)) as tmp:
            name = build(str(tmp), config_settings, metadata_directory)
            state = or_exit(pending.result)
            if editable:  # the package is imported from the source tree: keep the bundle out of its way
                assemble.relocate_for_editable(state)
            prefix = serving.bundle_prefix(state.project.package)
            wheel.rewrite(tmp / name, state.files, (bundle.ENTRY_POINT_GROUP, *state.entry_point),
                          drop_prefix=prefix)
            move(tmp / name, Path(wheel_directory) / name)
    finally:  # the wrapped build failed (or anything else): the bundle's child is stopped and reaped, not waited on
        pending.close()
    return name


STAGING = ".flytune-wheel-"  # + pid: a directory a killed build left is removed by the next build


@contextlib.contextmanager
def staging(wheel_directory: Path):
    """A private directory for the backend's bundle-less wheel, beside `wheel_directory` (the same
    file system, so the finished wheel is renamed in): a build killed at any moment leaves nothing in
    `wheel_directory`, and the next build removes what a dead build left beside it."""
    parent = wheel_directory.resolve().parent
    for place in (parent, wheel_directory):
        remove_stale(place)
    try:
        tmp = tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=parent)
    except OSError:  # the parent is not writable: inside, as a last resort
        tmp = tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=wheel_directory)
    try:
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale(directory: Path) -> None:
    """Remove the staging directories of builds whose process no longer runs."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(STAGING) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(STAGING):].split("-")[0]
        if not (pid.isascii() and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except (OSError, OverflowError):  # alive under another user, or not a pid: not ours to remove
            pass


def move(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`; across file systems, copy beside `dst` and rename, so `dst` appears whole."""
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def build_sdist(build, sdist_directory, config_settings) -> str:
    state = or_exit(run, ".")
    extra = None if state is None else or_exit(sdist_sources, state.project)  # before the backend writes
    name = build(sdist_directory, config_settings)
    if extra is not None:
        target = Path(sdist_directory) / name
        try:
            or_exit(sdist.rewrite, target, extra)
        except BaseException:  # failed, or interrupted (Ctrl-C): no sdist left behind without what it must carry
            target.unlink(missing_ok=True)
            raise
    return name


def sdist_sources(proj) -> dict[str, Path]:
    """What an sdist must carry so that sdist -> wheel gives the same bundle: path in the project -> file.
    What the build left out (a symlink escaping the root, a FIFO) stays out; a tuning plan that resolves
    outside the root, or is not a regular file, is a ProjectError."""
    extra = {"pyproject.toml": proj.root / "pyproject.toml"}
    for path, rel in collect.source_files(proj.root, proj.sources, problems=[]):
        size = os.stat(path).st_size
        if size > codec.MAX_DOCUMENT_BYTES:  # no artifact: the build dropped it (strict = false), or failed
            if proj.strict:
                raise ArtifactError(f"is {size} bytes, over the {codec.MAX_DOCUMENT_BYTES}-byte cap", file=rel)
            print(f"flytune: warning: left out of the sdist: {rel}: {size} bytes, over the artifact cap",
                  file=sys.stderr)
            continue
        extra[rel] = Path(path)
    if proj.tune_plan:
        plan = fsutil.contained(proj.root, proj.tune_plan, error=ProjectError, file=proj.root / "pyproject.toml",
                                field="tool.flytune.tune.plan")
        if plan is not None:
            extra[proj.tune_plan] = plan
    return extra


def prepare_metadata(prepare, metadata_directory, config_settings, *, editable: bool = False) -> str:
    name = prepare(metadata_directory, config_settings)
    proj = or_exit(load, ".")
    if proj is not None:
        ep_name = assemble.entry_point_name(proj.name, proj.package)
        value = serving.editable_value(ep_name) if editable else serving.bundle_value(proj.package)
        ep = Path(metadata_directory) / name / "entry_points.txt"
        old = ep.read_text("utf-8") if ep.exists() else ""
        ep.write_text(wheel.add_entry_point(old, bundle.ENTRY_POINT_GROUP, ep_name, value), "utf-8")
    return name


def or_exit(step, *args):
    """`step(*args)`; a FlytuneError becomes a clear message and exit status 1, not a traceback."""
    try:
        return step(*args)
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
