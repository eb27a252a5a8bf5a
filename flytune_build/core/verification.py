"""The rules a set of artifacts must keep, written once for the build, `flytune verify DIR` and the
wheel and installed-bundle verifier, so each defect reads the same wherever it is found.

Every rule is a pure function of the artifacts, a `where(artifact)` naming the file (or shard row)
each came from, and, for coverage and toolchain, the `Declaration` they answer to. Each returns
`Findings`: typed errors naming file, field and rule, and the artifacts they reject.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import choice, codec, inductor, options, specialization
from .errors import ArtifactError, BundleError, FlytuneError, ProjectError
from .key import is_dtype_name

if TYPE_CHECKING:
    from .artifact import Artifact
    from .bundle import Manifest
    from .project import Project
    from .target import Target

Where = Callable[["Artifact"], str]


@dataclass(frozen=True)
class Declaration:
    """The targets, coverage and Triton range artifacts answer to, and where they are written:
    `tool.flytune` in pyproject.toml for a project, the manifest for a built bundle."""
    targets: tuple[Target, ...]
    coverage: str | tuple[str, ...]      # "all", "none", or named kernels
    triton: str | None                   # a PEP 440 specifier set
    file: str
    coverage_field: str                  # the fields of `file` that declare coverage and the range
    triton_field: str
    error: type[FlytuneError]

    @classmethod
    def of_project(cls, proj: Project) -> Declaration:
        return cls(proj.targets, proj.coverage, proj.triton, str(proj.root / "pyproject.toml"),
                   "tool.flytune.coverage", "tool.flytune.triton", ProjectError)

    @classmethod
    def of_manifest(cls, manifest: Manifest, file: object) -> Declaration:
        return cls(manifest.targets, manifest.coverage, manifest.triton, str(file), "coverage", "toolchain.triton",
                   BundleError)


@dataclass
class Findings:
    """What rules found: errors in the order found, the artifacts they reject (by id), and notes."""
    errors: list[FlytuneError] = field(default_factory=list)
    rejected: set[int] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)

    def reject(self, error: FlytuneError, *arts: Artifact) -> None:
        self.errors.append(error)
        self.rejected.update(id(a) for a in arts)

    def merge(self, other: Findings) -> Findings:
        self.errors += other.errors
        self.rejected |= other.rejected
        self.warnings += other.warnings
        return self

    def kept(self, artifacts: Iterable[Artifact]) -> list[Artifact]:
        return [a for a in artifacts if id(a) not in self.rejected]

    def bundled(self, artifacts: Iterable[Artifact]) -> list[Artifact]:
        """The kept artifacts as a bundle holds them: each kernel's under one axis set (`conformed`)."""
        return conformed(self.kept(artifacts))


def check(artifacts: list[Artifact], where: Where, declared: Declaration | None = None, *,
          with_toolchain: bool = True, kernels: Iterable[str] = ()) -> Findings:
    """Key axes, conflicts, bundle file names, backend options, each config the winner its provenance
    records, then (with a declaration) the toolchain and, over the artifacts still kept, coverage of them
    and of `kernels` (the project's tuning plan). A verifier that only warns of drift runs `toolchain`
    itself; `rankings` (a warning unless `verify --strict`, never a build's rejection) is run apart."""
    found = key_axes(artifacts, where).merge(conflicts(artifacts, where)).merge(file_names(artifacts, where))
    found.merge(backend_options(artifacts, where)).merge(inductor_configs(artifacts, where))
    found.merge(chosen(artifacts, where)).merge(specializations(artifacts, where)).merge(unchecked(artifacts, where))
    if declared is not None:
        if with_toolchain:
            found.merge(toolchain(artifacts, where, declared))
        found.merge(coverage(found.kept(artifacts), declared, kernels))
    return found


@dataclass(frozen=True)
class Nullable:
    """One kernel's axes an artifact lacking them may read as null (`conform`)."""
    null: frozenset = frozenset()    # axes some artifact holds null (a parameter passed as None, or a None default)
    tensor: frozenset = frozenset()  # axes some artifact holds as a tensor's dtype (a tensor may be passed as None)

    def missing(self, a: Artifact) -> frozenset:
        """The axes `a` lacks and reads as null: every null-held one; and the tensor ones where `a` lacks a
        null-held axis too, the mark of the first release's derivation, which left every None argument
        out of the key. An artifact lacking only a tensor axis is another key (the kernel gained a
        parameter), not a None."""
        lacks = self.null.difference(a.key)
        return lacks | self.tensor.difference(a.key) if lacks else lacks


def nullable_axes(artifacts: Iterable[Artifact]) -> dict[str, Nullable]:
    """Per kernel, the axes an artifact of it that lacks them may read as null (`Nullable`)."""
    null: dict[str, set] = defaultdict(set)
    tensor: dict[str, set] = defaultdict(set)
    for a in artifacts:
        for axis, value in a.key.items():
            if value is None:
                null[a.kernel].add(axis)
            elif is_dtype_name(value):
                tensor[a.kernel].add(axis)
    return {k: Nullable(frozenset(v), frozenset(tensor[k])) for k, v in null.items()}


def conform(a: Artifact, nullable: Nullable | None) -> Artifact:
    """`a` with every axis it lacks and reads as null (`Nullable.missing`) set to null (`a` itself when
    it lacks none).

    Lossless: Triton keys nothing for a None argument, so the two keys stand for one Triton cache key,
    and a release that wrote no null axes (before 062c083) left exactly such parameters out. Its
    content address is that of the conformed key; the file read keeps its own name and bytes."""
    missing = nullable.missing(a) if nullable is not None else frozenset()
    if not missing:
        return a
    return type(a)(a.kernel, {**a.key, **dict.fromkeys(sorted(missing))}, a.device, a.config, a.provenance)


def conformed(artifacts: list[Artifact]) -> list[Artifact]:
    """Each artifact as `conform` reads it among `artifacts` (what the build bundles: one axis set per kernel)."""
    nullable = nullable_axes(artifacts)
    return [conform(a, nullable.get(a.kernel)) for a in artifacts]


def key_axes(artifacts: list[Artifact], where: Where) -> Findings:
    """One key-axis set per kernel, read as `conform` reads each artifact's: the majority's is the
    kernel's, every other artifact is named, with which release's derivation each group reads as."""
    found = Findings()
    by_kernel: dict[str, list[Artifact]] = defaultdict(list)
    for a in artifacts:
        by_kernel[a.kernel].append(a)
    nullable = nullable_axes(artifacts)
    for kernel, arts in sorted(by_kernel.items()):
        rule = nullable.get(kernel, Nullable())
        groups: dict[tuple, list[Artifact]] = defaultdict(list)
        for a in arts:
            groups[tuple(sorted(rule.missing(a).union(a.key)))].append(a)
        for axis in sorted(rule.tensor - rule.null):  # read as null as the first release's key: say so
            lacking = [a for a in arts if axis in rule.missing(a)]
            if lacking:
                found.warnings.append(
                    f"{where(lacking[0])}{f' and {len(lacking) - 1} more' if len(lacking) > 1 else ''}: no key axis "
                    f"{axis!r}, which kernel {kernel}'s other artifacts hold as a tensor's dtype: read as {axis}=None, "
                    f"as the first release wrote a call that passed None (it left every None argument out of the "
                    f"key, these lack {sorted(rule.null - set(lacking[0].key))} too). Where the kernel never "
                    f"takes None there, they never serve: re-tune them")
        if len(groups) < 2:
            continue
        main = max(groups, key=lambda k: (len(groups[k]), k))
        for axes, group in sorted(groups.items()):
            if axes == main:
                continue
            lacks, adds = sorted(set(main) - set(axes)), sorted(set(axes) - set(main))
            why = "; ".join(p for p in (f"lacks {lacks}" if lacks else "", f"adds {adds}" if adds else "") if p)
            for a in group:
                found.reject(ArtifactError(
                    f"has key axes {list(a.key_axes())}, which {why} against the {list(main)} of kernel {kernel}'s "
                    f"{len(groups[main])} other artifact(s) ({_written_by(groups[main], where)}; this one: "
                    f"{_written_by([a], where)}). An axis an artifact lacks reads as null only where another "
                    f"artifact of the kernel holds it null; any other difference is another key (the kernel's "
                    f"parameters or decorator key changed): re-tune these shapes with this release into a new "
                    f"directory, or remove the artifacts of the old key", file=where(a), field="key"), a)
    return found


def _written_by(arts: list[Artifact], where: Where) -> str:
    """The files, and which flytune wrote them on which day, as their provenance records it."""
    names = [where(a) for a in arts[:2]] + ([f"{len(arts) - 2} more"] if len(arts) > 2 else [])
    made = sorted({f"flytune {p['flytune']}" + (f" on {str(p['created'])[:10]}" if p.get("created") else "")
                   for p in ((a.provenance or {}) for a in arts) if p.get("flytune")})
    return ", ".join(names) + (f", written by {', '.join(made[:3])}" if made else "")


def backend_options(artifacts: list[Artifact], where: Where) -> Findings:
    """No config carries another backend's compiler option (`options.BACKEND_KWARGS`): an MI300X's
    `waves_per_eu` in an H200's artifact is refused by Triton at launch, so it is refused here; nor a
    value the option does not take (`options.BACKEND_VALUES`: `kpack: 4`), nor a `num_warps` the device's
    backend cannot compile (`options.config_problems`, every importer's check too)."""
    found = Findings()
    for a in artifacts:
        for name, rule in options.config_problems(a.config.kwargs, a.config.num_warps, a.device.backend):
            field = f"config.kwargs.{name}" if name in a.config.kwargs else f"config.{name}"
            found.reject(ArtifactError(rule, file=where(a), field=field), a)
    return found


def specializations(artifacts: list[Artifact], where: Where) -> Findings:
    """A warning for each recorded specialization holding a compile option the warm-up never hands the
    compiler (`specialization.option_problems`: releases before the closed set recorded any scalar launch
    keyword): its config serves as it is; `flytune warmup` does not compile it ahead."""
    found = Findings()
    for a in artifacts:
        spec = (a.provenance or {}).get("specialization")
        for name, problem in specialization.option_problems(spec, a.config.kwargs) if spec is not None else ():
            found.warnings.append(f"{where(a)}: Field `provenance.specialization.options.{name}` {problem}: its "
                                  f"config is served, but `flytune warmup` does not compile it ahead (re-tune to "
                                  f"record a specialization this release warms)")
    return found


DELIBERATE = "not checked: the plan entry says check = false"   # no warning: the plan chose it


def unchecked(artifacts: list[Artifact], where: Where) -> Findings:
    """One warning per kernel whose winners were tuned without their outputs checked where the plan asked
    for the check (`provenance.outputs.note`: tensors too large to copy, none that can be put back, no
    config that launched for the reference): nothing a tune could not check passes a build in silence."""
    found, by_kernel = Findings(), {}
    for a in artifacts:
        outputs = (a.provenance or {}).get("outputs")
        note = outputs.get("note") if isinstance(outputs, dict) else None
        if isinstance(note, str) and note.startswith("not checked") and note != DELIBERATE:
            by_kernel.setdefault(a.kernel, []).append((a, note))
    for kernel, arts in sorted(by_kernel.items()):
        a, note = arts[0]
        more = f" (and {len(arts) - 1} more of its artifacts)" if len(arts) > 1 else ""
        found.warnings.append(f"{where(a)}: Field `provenance.outputs.note` says {note!r}{more}: {kernel}'s winner "
                              f"was chosen without its outputs checked")
    return found


def inductor_configs(artifacts: list[Artifact], where: Where) -> Findings:
    """An Inductor artifact (core.inductor) holds a lookup hash and what Inductor's lookup serves as
    written: block sizes, num_warps, num_stages; anything else would be dropped silently at compile time."""
    found = Findings()
    for a in artifacts:
        for name, rule in inductor.problems(a.key, a.config):
            found.reject(ArtifactError(rule, file=where(a), field=name), a)
    return found


_EXACT = frozenset((str, int))  # key value types whose JSON and Python equality agree


def runtime_identity(a: Artifact) -> str:
    """The identity as the runtime's index tells artifacts apart: key values compared as Python
    compares them (256 and 256.0 are one key, as are 1 and True), so two artifacts the runtime cannot
    tell apart are one identity even where their content addresses differ. It is the content address
    of the artifact with such values written as integers (most keys hold none: their own address)."""
    if set(map(type, a.key.values())) <= _EXACT:
        return a.address
    key = {k: int(v) if type(v) is bool or (type(v) is float and v.is_integer()) else v for k, v in a.key.items()}
    return type(a)(a.kernel, key, a.device, a.config).address


def conflicts(artifacts: list[Artifact], where: Where) -> Findings:
    """One config per identity (the runtime's): two configs reject both; a duplicate is kept once, noted."""
    found = Findings()
    seen: dict[str, Artifact] = {}
    nullable = nullable_axes(artifacts)
    plain = {type(v) for a in artifacts for v in a.key.values()} <= _EXACT  # no float or bool: the address
    for a in artifacts:
        c = conform(a, nullable.get(a.kernel))  # an earlier release's key and this one's: one identity
        first = seen.setdefault(c.address if plain else runtime_identity(c), a)
        if first is a:
            continue
        same = "same identity" if first.address == a.address else \
            f"the same identity to the runtime (key {dict(first.key)} and {dict(a.key)} are equal in Python, " \
            f"an axis one lacks reading as the other's null)"
        if first.config != a.config:
            found.reject(ArtifactError(f"conflicts with {where(first)}: {same} (kernel, key, device), "
                                       f"different config ({first.config} vs {a.config})",
                                       file=where(a), field="config"), a, first)
        else:
            found.rejected.add(id(a))
            found.warnings.append(f"{where(a)} duplicates {where(first)}; kept once")
    return found


def file_names(artifacts: list[Artifact], where: Where) -> Findings:
    """Each kernel's bundle files (core.bundle's shard and provenance names) are its own: none is the
    manifest or another kernel's file, nor differs from one only in case or Unicode form (one file on
    macOS or Windows: `fsutil.one_file`). A kernel that would collide is rejected, named."""
    from . import bundle
    from .fsutil import one_file

    found = Findings()
    owner = {one_file(bundle.MANIFEST): (None, bundle.MANIFEST)}
    for kernel in sorted({a.kernel for a in artifacts}):
        for name in (bundle.shard_name(kernel), bundle.provenance_name(kernel)):
            other, other_name = owner.setdefault(one_file(name), (kernel, name))
            if other == kernel:
                continue
            arts = [a for a in artifacts if a.kernel == kernel]
            what = "the bundle's manifest" if other is None else f"{other_name}, a file of kernel {other}"
            how = "is" if name == other_name else "differs only in case or Unicode form from"
            found.reject(ArtifactError(f"names kernel {kernel!r}, whose bundle file {name} {how} {what}: the bundle "
                                       f"could not hold both (rename the kernel)", file=where(arts[0]), field="kernel"),
                         *arts)
            break
    return found


def chosen(artifacts: list[Artifact], where: Where) -> Findings:
    """Each config is the winner its own provenance records (`choice.contradicted`): an artifact whose
    config was edited after its search is rejected, naming the winner it records. One that records no
    search (written by hand), a maintainer's choice (`provenance.by_hand`) or an import is not."""
    found = Findings()
    for a in artifacts:
        why = choice.contradicted(a.config, a.provenance)
        if why is not None:
            found.reject(ArtifactError(why, file=where(a), field="config"), a)
    return found


def ranked(a: Artifact) -> str | None:
    """How an artifact's winner was ranked, as rankings compare: `synthetic` (a deterministic rank, never
    a time), `measured` (measured, or imported from another tool's measurements), None where unrecorded."""
    r = (a.provenance or {}).get("ranking")
    return "synthetic" if r == "synthetic" else "measured" if r in ("measured", "imported") else None


def rankings(artifacts: list[Artifact], where: Where) -> Findings:
    """No device's winners mix a synthetic ranking with measured ones: a synthetic rank is not a time, so
    a bundle serving both for one device ships arbitrary winners as tuned ones. Each synthetic artifact
    beside a measured one of its device is named, with them: `flytune verify` warns (a violation under
    --strict), the build warns and bundles them all the same (a re-tune beside an earlier release's
    synthetic folder builds strict, as it always did).

    Compared: every artifact that records how it was chosen (`provenance.measurement` or `.selection`,
    which every search since 062c083 writes), and each kernel whose own artifacts for the device were
    ranked both ways. The first releases recorded an adopted kernel's winners, which Triton timed, as
    measured in a synthetic run, beside the ported kernels' synthetic ones and recording neither: such a
    folder keeps verifying as it always did."""
    found = Findings()
    by_device: dict[str, list[Artifact]] = defaultdict(list)
    for a in artifacts:
        if ranked(a) is not None:
            by_device[a.device.spec()].append(a)
    for spec, arts in sorted(by_device.items()):
        kinds: dict[str, set] = defaultdict(set)
        for a in arts:
            kinds[a.kernel].add(ranked(a))
        counted = [a for a in arts if len(kinds[a.kernel]) > 1 or _records_choice(a)]
        measured = [a for a in counted if ranked(a) == "measured"]
        if not measured:
            continue
        names = ", ".join(where(a) for a in measured[:2]) + (f" and {len(measured) - 2} more" if len(measured) > 2
                                                              else "")
        for a in counted:
            if ranked(a) == "synthetic":
                found.reject(ArtifactError(
                    f"is synthetic, beside {len(measured)} measured artifact(s) for device {spec} ({names}): the "
                    f"rankings are mixed, and a synthetic rank is not a time (re-tune the synthetic shapes on the "
                    f"device with `flytune tune --ranking measured`, or remove them)",
                    file=where(a), field="provenance.ranking"), a)
    return found


def _records_choice(a: Artifact) -> bool:
    p = a.provenance or {}
    return isinstance(p.get("measurement"), Mapping) or isinstance(p.get("selection"), Mapping)


def toolchain(artifacts: list[Artifact], where: Where, declared: Declaration) -> Findings:
    """Each artifact tuned with a Triton inside the declared range (toolchain drift otherwise)."""
    found = Findings()
    if not declared.triton:
        return found
    within: dict[str, bool] = {}  # tuned version -> inside the range (a bundle holds few versions)
    for a in artifacts:
        tuned = (a.provenance or {}).get("triton")
        if tuned is None:
            found.reject(ArtifactError(f"is required when tool.flytune.triton = {declared.triton!r} is declared",
                                       file=where(a), field="provenance.triton"), a)
            continue
        if tuned not in within:
            within[tuned] = in_range(tuned, declared.triton)
        if not within[tuned]:
            found.reject(ArtifactError(f"is {tuned}, outside the declared Triton range {declared.triton!r} "
                                       f"(toolchain drift: re-tune, or widen tool.flytune.triton)",
                                       file=where(a), field="provenance.triton"), a)
    return found


def installed_toolchain(installed: str | None, declared: Declaration) -> FlytuneError | None:
    """The Triton this interpreter would run the configs with, outside the declared range."""
    if not declared.triton or installed is None or in_range(installed, declared.triton):
        return None
    return declared.error(f"the installed Triton {installed} is outside the declared range {declared.triton!r} "
                          f"(toolchain drift)", file=declared.file, field=declared.triton_field)


def in_range(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet  # only where a range is declared
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def coverage(artifacts: list[Artifact], declared: Declaration, planned: Iterable[str] = ()) -> Findings:
    """Every covered kernel has an artifact for every declared target. With `coverage = "all"` the
    covered kernels are those of the artifacts and the `planned` ones (the tuning plan's), so a planned
    kernel with no artifact at all is a gap too."""
    found = Findings()
    if declared.coverage == "none":
        return found
    planned = set(planned)
    if not artifacts and not planned:
        found.errors.append(declared.error("is not met: the sources hold no artifact for any declared target "
                                           "(set coverage = \"none\" to build without tuned configs)",
                                           file=declared.file, field=declared.coverage_field))
        return found
    known = {a.kernel for a in artifacts} | planned
    kernels = sorted(known) if declared.coverage == "all" else list(declared.coverage)
    for kernel in kernels:
        if declared.coverage != "all" and kernel not in known:   # one error, not one per target: a typo?
            found.errors.append(declared.error(f"is not met: kernel {kernel} has no artifact for any declared "
                                               f"target, nor is it in the tuning plan"
                                               f"{codec.did_you_mean(kernel, known)}",
                                               file=declared.file, field=declared.coverage_field))
            continue
        for i, t in enumerate(declared.targets):
            if not any(a.kernel == kernel and t.covers(a.device) for a in artifacts):
                found.errors.append(declared.error(f"is not met: kernel {kernel} has no artifact for target "
                                                   f"{t.label()} (tool.flytune.targets[{i}]): tune it on that device "
                                                   f"(`flytune tune` there), or drop the target",
                                                   file=declared.file, field=declared.coverage_field))
    return found
