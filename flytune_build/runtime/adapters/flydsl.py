"""FlyDSL at run time: the installed bundles' hip artifacts made visible to FlyDSL through
FLYDSL_AUTOTUNE_CONFIG_DIR.

The files are written in FlyDSL's format by the writer passed in (`interop.flydsl.export`, passed by
the public path `flytune_build.flydsl`): the runtime imports no interop, so runtime and the engines meet
only in core.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable

from ...core import settings
from ...core.artifact import Artifact
from .. import warning


def expose(write: Callable[[Iterable[Artifact], Path], object]) -> Path | None:
    """Make the installed bundles' hip artifacts visible to FlyDSL, written by `write(artifacts, directory)`.

    With FLYDSL_AUTOTUNE_CONFIG_DIR unset, their union is written into a cache directory and the
    variable points there; set, the user's directory wins (said once). Returns the directory in use.
    """
    from ...core import bundle
    from ..serving.offline import TIER

    user = settings.current().flydsl_dir
    if user:
        warning.once(("flydsl-dir", user), f"FLYDSL_AUTOTUNE_CONFIG_DIR={user} is set: FlyDSL reads the user's "
                     f"directory, not the installed bundles' configs")
        return Path(user)
    arts = []
    for src in TIER.sources():
        if src.manifest is None:
            continue
        got = bundle.read_directory(src.root)  # every file capped (docs/security.md)
        for e in got.errors:
            warning.once(("flydsl-bundle", str(e)), f"{e}; not exposed to FlyDSL")
        if not got.errors:
            serves = {k: any(s is src for _, s in TIER.ranked(k)) for k in src.manifest.kernels}  # owner or accepted pack
            arts += [a for a in got.artifacts if a.device.backend == "hip" and serves.get(a.kernel)]
    if not arts:
        return None
    digest = hashlib.sha256("".join(sorted(a.address + str(a.config) for a in arts)).encode()).hexdigest()[:16]
    from ..serving.scratch import cache_dir

    out = cache_dir().parent / "flydsl" / digest
    if not out.is_dir():
        write(arts, out)
    os.environ["FLYDSL_AUTOTUNE_CONFIG_DIR"] = str(out)
    return out
