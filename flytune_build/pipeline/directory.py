"""The bundle written into a package's source directory, for build backends flytune does not wrap.

`<package dir>/_flytune/` gets exactly the files a wheel built by `flytune_build.backend` carries
under `<package>/_flytune/` (manifest, shards, provenance files), byte for byte; any backend that
ships package data (flit_core, pdm-backend, maturin, scikit-build-core, ...) then carries it. The
directory is replaced whole, so a removed kernel leaves no stale shard; a directory of that name that
is not a flytune bundle, or a bundle holding anything a bundle never holds (a file not named as a
manifest, shard or provenance file is, a folder, a link), is never touched: it is refused, each such
entry named. A package directory that is a bundle directory, or lies inside one, is refused before anything
is built (`check_output`).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..core import bundle, serving
from ..core.errors import BundleError, UsageError
from ..core.fsutil import atomic_write
from .state import BuildState


def write(state: BuildState, package_dir: str | os.PathLike) -> list[Path]:
    """Replace `<package_dir>/_flytune/` with the assembled bundle; returns the files written."""
    check_output(package_dir)
    package_dir = Path(package_dir)
    target = package_dir / bundle.DIRNAME
    prefix = serving.bundle_prefix(state.project.package)
    if target.is_symlink():
        raise BundleError(f"is a symbolic link (to {os.readlink(target)}): not replacing it, nor what it points to; "
                          f"remove the link, and the bundle is written here", file=target)
    if target.exists() and not (target / bundle.MANIFEST).is_file() and (not target.is_dir() or any(target.iterdir())):
        raise BundleError(f"exists and is not a flytune bundle (no {bundle.MANIFEST}): not replacing it",
                          file=target)
    if target.is_dir():
        _refuse_foreign(target)
    try:
        package_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{bundle.DIRNAME}-", dir=package_dir))
    except OSError as e:  # a file where a directory must be, no permission, ...
        raise BundleError(f"cannot hold the bundle: {e.strerror or e}", file=package_dir) from None
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would follow the directory into place
        for name, data in sorted(state.files.items()):
            atomic_write(staging / name[len(prefix):], data)
        old = None
        if target.exists():
            old = package_dir / f"{staging.name}-old"
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return [target / name[len(prefix):] for name in sorted(state.files)]


def check_output(package_dir: str | os.PathLike) -> None:
    """A UsageError, before anything is built, where `package_dir` is a bundle directory (named `_flytune`)
    or lies inside one (a `_flytune/` holding a manifest): the bundle would be written into a bundle, where
    nothing reads it, and the next bundle into the package would be refused for the folder left there."""
    real = Path(os.path.realpath(package_dir))
    for place in (real, *real.parents):
        if place.name == bundle.DIRNAME and (place == real or (place / bundle.MANIFEST).is_file()):
            where = "is" if place == real else f"is inside {place}, which is"
            raise UsageError(f"{where} a flytune bundle directory ({bundle.DIRNAME}/), not a package's: the bundle "
                             f"would nest in a bundle; pass the package directory that holds it: --output "
                             f"{os.path.relpath(place.parent)}", file=package_dir)


_LITTER = frozenset((".DS_Store", "Thumbs.db"))   # what file browsers leave in any folder: lost with nothing of value


def _refuse_foreign(target: Path) -> None:
    """Raise naming what `target` (a bundle being replaced whole) holds that no bundle holds: replacing
    it would lose those entries."""
    try:
        foreign = sorted(p.name for p in target.iterdir() if p.name not in _LITTER and (
            p.is_symlink() or not p.is_file() or not bundle.SHARD_NAME.fullmatch(p.name)))
    except OSError as e:
        raise BundleError(f"cannot be read: {e.strerror or e}", file=target) from None
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise BundleError(f"holds {shown}, which no flytune bundle holds: the bundle replaces the directory whole, "
                          f"so move them out of it first (nothing was written)", file=target)
