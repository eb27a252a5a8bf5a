"""`flytune verify --deep / --execute`: check artifacts against the kernels they name.

--deep imports the package in the current environment and checks each artifact against the kernel
registered under its name (`runtime.serving.registry`: `flytune_build.autotune` kernels and `@triton.autotune`
kernels the package adopts alike); --execute also runs each artifact that matches this device once,
through the kernel's declared `validate(key)` reference check, and records per artifact whether it
ran and, where not, why (`Source.execution`, in `--json`). An --execute that ran no artifact is a
violation: a check that checked nothing never passes.

A config is the kernel's to choose: --deep refuses an artifact that records a search (its provenance
lists candidates) whose config is none of the kernel's declared configs nor of those candidates (a
pruner may make one up), or is not the winner its provenance's selection names (edited by hand after
the search). A maintainer who chooses a config by hand says so, and why, in `provenance.by_hand`;
--deep then accepts it and shows it as a warning. An imported config (`provenance.ranking: imported`)
names its source, and an artifact that records no search has none to contradict: both are accepted. The
package imported is only one the project or distribution itself declares (`[tool.flytune].package`,
or a package the wheel's or installed distribution's own files install): never a name read from
artifact or manifest data alone.

An Inductor artifact (core.inductor: its key is Inductor's lookup hash) names a compile entry, not a
`@triton.jit` kernel the package defines: Inductor generates its kernel when torch.compile runs under
`flytune_build.inductor.serve()`. --deep checks it by what can be checked without a GPU and Inductor,
the build's rules (`core.inductor.problems`), and says once how many it checked so; --execute skips it
("compiled by torch.compile", in `--json`).
"""
from __future__ import annotations

import importlib

from ..core.errors import (
    ArtifactError,
    ArtifactExecutionError,
    BundleError,
    FlytuneError,
    InputError,
    foreign_failure,
)
from ..core import inductor, streams
from ..core.codec import Fields
from ..core.config import Config
from ..core.target import match_level
from ..runtime import device


def check(src, *, execute: bool = False) -> None:
    from ..runtime.serving import registry

    if execute:
        src.execution = []
    package = declared_package(src)
    if package is None:
        return
    try:
        with streams.to_stderr():  # what the import prints never mixes into the report
            importlib.import_module(package)
    except BaseException as e:  # the package is the user's code: any failure is a finding, not a crash
        if not foreign_failure(e):
            raise
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and package.split(".")[0] == e.name.split(".")[0]:
            hint = ("; --deep imports the package: install the project first (`pip install -e .`, or its wheel) "
                    "in this environment")
        src.errors.append(FlytuneError(f"cannot be imported for --deep: {type(e).__name__}: {e}{hint}",
                                       file=package))
        return
    here = device.current() if execute else None
    for art in _kernels_own(src):
        k = registry.kernel(art.kernel)  # a flytune_build.autotune kernel, or an adopted @triton.autotune one
        if k is None:
            src.errors.append(ArtifactError(f"names kernel {art.kernel}, which importing {package} neither "
                                            f"defines nor adopts", file=art.filename, field="kernel"))
            _ran(src, art, f"kernel {art.kernel} is not defined by {package}")
            continue
        try:
            k.check_key(art.key, art.filename)
            k.check_binds(art.config, set(k.arg_names) - set(k.tuned_kwargs), "config", file=art.filename)
            note = check_chosen(k, art)
            if note:
                src.warnings.append(note)
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
            with k.forcing(art.config), streams.to_stderr():
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


INDUCTOR_SKIPPED = "an Inductor artifact: torch.compile compiles its kernel under flytune_build.inductor.serve()"


def _kernels_own(src) -> list:
    """The artifacts of kernels the package defines or adopts; each Inductor artifact (Inductor generates
    its kernel, the package never defines it) is checked here by the build's rules and set aside."""
    own, compiled = [], 0
    for art in src.artifacts:
        if inductor.AXIS not in art.key:
            own.append(art)
            continue
        compiled += 1
        for field, rule in inductor.problems(art.key, art.config):
            src.errors.append(ArtifactError(rule, file=art.filename, field=field))
        _ran(src, art, INDUCTOR_SKIPPED)
    if compiled:
        src.warnings.append(f"{compiled} Inductor artifact(s) checked by the build's rules only (lookup hash, block "
                            f"sizes, num_warps, num_stages): torch.compile compiles their kernels under "
                            f"`flytune_build.inductor.serve()`, where a GPU and Inductor check the rest")
    return own


def check_chosen(k, art) -> str | None:
    """Raise an ArtifactError unless `art`'s config is one kernel `k` could have chosen (see the module
    docstring); the note `verify` shows for a config chosen by hand."""
    prov = art.provenance or {}
    if isinstance(prov.get("by_hand"), str):
        return f"{art.filename}: config {art.config} chosen by hand: {prov['by_hand']}"
    if prov.get("ranking") == "imported":
        return None
    f = Fields(art.filename, ArtifactError)
    cands = prov.get("candidates") if isinstance(prov.get("candidates"), list) else []
    if not cands:
        return None
    searched = [_config(c.get("config") if isinstance(c, dict) else None, f) for c in cands]
    if art.config not in set(k.configs) and art.config not in searched:
        f.fail("config", f"is {art.config}, none of kernel {k.name}'s declared configs nor of the candidates its "
                         f"provenance searched (a config chosen by hand says why in provenance.by_hand)")
    chosen = prov.get("selection") if isinstance(prov.get("selection"), dict) else {}
    winner = chosen.get("winner")
    if isinstance(winner, int) and 0 <= winner < len(searched) and searched[winner] is not None \
            and searched[winner] != art.config:
        f.fail("config", f"is {art.config}, but its provenance's selection chose candidate #{winner}, "
                         f"{searched[winner]} (edited after the search? a config chosen by hand says why in "
                         f"provenance.by_hand)")
    return None


def _config(doc, f) -> Config | None:
    try:
        return Config.from_json(doc, f)
    except FlytuneError:
        return None


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
