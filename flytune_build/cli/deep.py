"""`flytune verify --deep / --execute`: check artifacts against the decorated kernels they name.

--deep imports the package in the current environment; --execute also runs each artifact that
matches this device once, through the kernel's declared `validate(key)` reference check.
"""
from __future__ import annotations

import importlib

from ..core.errors import ArtifactError, ArtifactExecutionError, FlytuneError
from ..core.target import match_level
from ..runtime import device


def check(src, *, execute: bool = False) -> None:
    from ..runtime import autotuner

    package = src.package
    if package is None and src.artifacts:
        package = src.artifacts[0].kernel.rsplit(".", 1)[0]
    try:
        importlib.import_module(package)
    except Exception as e:  # the package is the user's code: any failure is a finding, not a crash
        src.errors.append(FlytuneError(f"cannot be imported for --deep: {type(e).__name__}: {e}", file=package))
        return
    here = device.current() if execute else None
    for art in src.artifacts:
        k = autotuner.kernel(art.kernel)
        if k is None:
            src.errors.append(ArtifactError(f"names kernel {art.kernel}, which importing {package} does not define",
                                            file=art.filename, field="kernel"))
            continue
        if set(art.key) != set(k.axis_names):
            src.errors.append(ArtifactError(f"has key axes {sorted(art.key)}, but the decorator declares "
                                            f"{sorted(k.axis_names)}", file=art.filename, field="key"))
            continue
        try:
            k.check_binds(art.config, set(k.arg_names) - set(k.tuned_kwargs), "config", file=art.filename)
        except FlytuneError as e:
            src.errors.append(e)
            continue
        if execute and match_level(art.device, here) is not None:
            if k.validate is None:
                src.warnings.append(f"{art.filename}: kernel {k.name} declares no `validate`: not executed")
                continue
            try:
                with k.forcing(art.config):
                    k.validate(dict(art.key))
            except Exception as e:
                src.errors.append(ArtifactExecutionError(
                    f"failed when executed on {here}: {type(e).__name__}: {e}", file=art.filename, field="config"))
