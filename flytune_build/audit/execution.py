"""`flytune verify --deep / --execute`: check artifacts against the kernels they name.

--deep imports the package in the current environment and checks each artifact against the kernel
registered under its name (`runtime.registry`: `flytune_build.autotune` kernels and `@triton.autotune`
kernels the package adopts alike); --execute also runs each artifact that matches this device once,
through the kernel's declared `validate(key)` reference check, and records per artifact whether it
ran and, where not, why (`Source.execution`, in `--json`). An --execute that ran no artifact is a
violation: a check that checked nothing never passes. The
package imported is only one the project or distribution itself declares (`[tool.flytune].package`,
or a package the wheel's or installed distribution's own files install): never a name read from
artifact or manifest data alone.
"""
from __future__ import annotations

import contextlib
import importlib
import sys

from ..core.errors import (
    ArtifactError,
    ArtifactExecutionError,
    BundleError,
    FlytuneError,
    InputError,
    foreign_failure,
)
from ..core.target import match_level
from ..runtime import device


def check(src, *, execute: bool = False) -> None:
    from ..runtime import registry

    if execute:
        src.execution = []
    package = declared_package(src)
    if package is None:
        return
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what the import prints never mixes into the report
            importlib.import_module(package)
    except BaseException as e:  # the package is the user's code: any failure is a finding, not a crash
        if not foreign_failure(e):
            raise
        src.errors.append(FlytuneError(f"cannot be imported for --deep: {type(e).__name__}: {e}", file=package))
        return
    here = device.current() if execute else None
    for art in src.artifacts:
        k = registry.kernel(art.kernel)  # a flytune_build.autotune kernel, or an adopted @triton.autotune one
        if k is None:
            src.errors.append(ArtifactError(f"names kernel {art.kernel}, which importing {package} neither "
                                            f"defines nor adopts", file=art.filename, field="kernel"))
            _ran(src, art, f"kernel {art.kernel} is not defined by {package}")
            continue
        try:
            k.check_key(art.key, art.filename)
            k.check_binds(art.config, set(k.arg_names) - set(k.tuned_kwargs), "config", file=art.filename)
        except FlytuneError as e:
            src.errors.append(e)
            _ran(src, art, "refused by --deep")
            continue
        if not execute:
            continue
        if match_level(art.device, here) is None:
            _ran(src, art, f"tuned for {art.device.spec()}, not this device ({here})")
            continue
        if k.validate is None:
            src.warnings.append(f"{art.filename}: kernel {k.name} declares no `validate`: not executed")
            _ran(src, art, f"kernel {k.name} declares no `validate`")
            continue
        try:
            with k.forcing(art.config), contextlib.redirect_stdout(sys.stderr):
                k.validate(dict(art.key))
        except BaseException as e:
            if not foreign_failure(e):
                raise
            src.errors.append(ArtifactExecutionError(
                f"failed when executed on {here}: {type(e).__name__}: {e}", file=art.filename, field="config"))
            _ran(src, art, None, ok=False)
            continue
        _ran(src, art, None, ok=True)
    if execute and not any(r["executed"] for r in src.execution):
        src.errors.append(FlytuneError(f"--execute ran no artifact on {here}: {_why_none(src.execution)}",
                                       file=src.path))


def _ran(src, art, skipped: str | None, ok: bool | None = None) -> None:
    """Record what --execute did with `art`: executed (and whether it passed), or skipped and why."""
    if src.execution is not None:
        src.execution.append({"artifact": art.filename, "kernel": art.kernel, "device": art.device.spec(),
                              "executed": skipped is None, "ok": ok, "skipped": skipped})


def _why_none(execution: list[dict]) -> str:
    if not execution:
        return "it holds no artifact"
    reasons: dict[str, int] = {}
    for r in execution:
        reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
    return "; ".join(f"{n} artifact(s) skipped: {why}" for why, n in sorted(reasons.items()))


def declared_package(src) -> str | None:
    """The package --deep may import: the manifest's or project's, when the source itself installs or
    declares it; else None, with the reason recorded in `src.errors`."""
    package = src.package
    if package is None:
        src.errors.append(InputError("declares no package (a directory of artifacts): --deep needs a project, "
                                       "a wheel or an installed distribution", file=src.path))
        return None
    if package not in src.modules:
        src.errors.append(BundleError(f"names package {package!r}, which this {src.kind} does not install: --deep "
                                       f"imports only the distribution's own packages", file=src.path,
                                       field="package"))
        return None
    return package
