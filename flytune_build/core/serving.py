"""The serving rules, each written once: which artifacts a kernel may be served, from where, and which wins.

Used by the runtime's offline tier and warm-up, the adopted-kernel adapter, the FlyDSL export and
`flytune verify / inspect` alike, so what a verifier reports is what the runtime does.

- Where a bundle lives: a `[flytune.bundles]` entry point's value is a dotted module name inside the
  distribution's own files (`<package>._flytune`, or an editable wheel's `__flytune_editable__.<name>`);
  anything else (a path, an absolute directory, `..`) names no bundle.
- Who owns a kernel: a kernel's name is module-qualified (`sample_pkg.rmsnorm`), so the bundle of
  package P owns the kernels named P or P.<anything> (the longest such package, when several are
  installed), where its distribution owns P (`owns`: it installs P, and no `__init__.py` of P or its
  parents is another distribution's; an editable install owns P where its source tree holds P). Two
  distributions listing one `__init__.py` as their own is ambiguity, never ownership (`contest`): the
  one that ships that package's own bundle owns it, unless another installs more of the package; else
  none does (a pkgutil namespace stub aside). Where P
  is imported from elsewhere than where the distribution installed it, its bundle serves only where
  that tree is the distribution's own source (core.installed.source_tree: run from the project root).
  Artifacts a bundle holds for any other kernel are a *config pack* for that kernel's owner.
- Which packs serve: only those the owner's manifest accepts by distribution name (`[tool.flytune]
  packs`) or the user opts into (FLYTUNE_PACKS); the owner's artifacts win at every match level, packs
  fill what the owner lacks.
- Which artifact wins per key: the best rank, then the best accepted match level, then the first.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from . import codec
from .device import DeviceIdentity
from .target import LEVELS, match_level

DIRNAME = "_flytune"
EDITABLE_ROOT = "__flytune_editable__"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# PEP 508 distribution names (what `[tool.flytune] packs` and FLYTUNE_PACKS list)
DIST_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]")

# what a source is to a kernel, best first: FLYTUNE_ARTIFACT_DIR (the user's own), the owner's bundle,
# a config pack the owner or the user accepted
USER, OWNER, PACK = 0, 1, 2


def normalize(dist_name: str) -> str:
    """A distribution name as PEP 503 compares them (`Vendor_Configs` and `vendor.configs` are one)."""
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def bundle_value(package: str) -> str:
    """The entry-point value of `package`'s bundle."""
    return f"{package}.{DIRNAME}"


def editable_value(name: str) -> str:
    """The entry-point value of an editable wheel's bundle, for the entry point named `name`."""
    return f"{EDITABLE_ROOT}.{name}"


def bundle_prefix(package: str) -> str:
    """Where `package`'s bundle sits in a wheel: `<package path>/_flytune/`."""
    return package.replace(".", "/") + f"/{DIRNAME}/"


def bundle_parts(value: str) -> tuple[str, ...] | None:
    """The bundle directory an entry-point value names, as path parts relative to the distribution's
    own location; None when the value is no dotted module name (a path, an absolute directory, `..`, an
    object reference `module:attr`): the runtime and `verify` refuse the same values."""
    module = value.strip()
    parts = tuple(module.split("."))
    if not module or len(module) > 1024 or not all(IDENTIFIER.fullmatch(p) for p in parts):
        return None
    return parts


def bundle_package(value: str) -> str | None:
    """The package whose bundle an entry-point value names (`pkg._flytune` -> `pkg`); None for an
    editable wheel's value or any other module."""
    parts = bundle_parts(value)
    if parts is None or len(parts) < 2 or parts[-1] != DIRNAME or parts[0] == EDITABLE_ROOT:
        return None
    return ".".join(parts[:-1])


def is_editable_value(value: str) -> bool:
    parts = bundle_parts(value)
    return parts is not None and len(parts) == 2 and parts[0] == EDITABLE_ROOT


def under(name: str, package: str) -> bool:
    """Whether `name` (a kernel or module) is `package` or lies under it."""
    return name == package or name.startswith(package + ".")


def owner(kernel: str, packages: Iterable[str]) -> str | None:
    """The package among `packages` that owns `kernel`: the longest one it lies under."""
    found = [p for p in packages if under(kernel, p)]
    return max(found, key=len) if found else None


def installs(paths: Iterable[str], package: str) -> bool:
    """Whether files at `paths` (a wheel's members, a distribution's RECORD) install `package` itself:
    a module directly in its directory, the bundle's own `_flytune/` aside."""
    base = package.replace(".", "/") + "/"
    for p in paths:
        p = str(p).replace("\\", "/")
        if p.startswith(base) and "/" not in p[len(base):] and p.endswith((".py", ".so", ".pyd")):
            return True
    return False


def owns(paths: Collection[str], package: str, exists: Callable[[str], bool]) -> bool:
    """Whether a distribution whose own files are `paths` (its RECORD) owns `package`: it installs a
    module directly in it (`installs`), and every `__init__.py` of the package and of its parents that
    `exists` where the distribution is installed is one of its own files. A bundle dropped into another
    distribution's regular package (`fla/ops/_flytune/`, or a new `fla/ops/mine/` beside it) owns
    nothing; a portion of a namespace package (parents without `__init__.py`) owns its package."""
    return not disowned(paths, package, exists)


def disowned(paths: Collection[str], package: str, exists: Callable[[str], bool],
             shared: Callable[[str, str], str] | None = None) -> str:
    """Why a distribution whose own files are `paths` does not own `package` (`owns`), '' where it does.
    `shared(init, parent)`, where given, is asked about each `__init__.py` of the package or a parent that
    the distribution lists as its own: what other distributions listing the same file make of that claim
    ('' where it stands, else why not: `contest`)."""
    if not installs(paths, package):
        return f"it installs no module of package {package} itself"
    parts = package.split(".")
    for depth in range(1, len(parts) + 1):
        init = "/".join(parts[:depth]) + "/__init__.py"
        if init not in paths:
            if exists(init):
                return (f"{init} is not among its own files: package {'.'.join(parts[:depth])} is another "
                        f"distribution's, and {package} lies in it")
            continue
        why = shared(init, ".".join(parts[:depth])) if shared is not None else ""
        if why:
            return why
    return ""


def modules(paths: Iterable[str], package: str) -> int:
    """How many modules directly in `package`, its `__init__.py` aside, files at `paths` install (paths,
    or RECORD lines: a path and its hash and size after commas)."""
    base = package.replace(".", "/") + "/"
    names = (str(p).split(",", 1)[0].replace("\\", "/")[len(base):] for p in paths if str(p).startswith(base))
    return sum(1 for n in names if "/" not in n and n.endswith((".py", ".so", ".pyd")) and n != "__init__.py")


def contest(claims: Mapping[str, tuple[bool, int]], namespace: bool) -> tuple[str, ...]:
    """Who owns a package whose `__init__.py` several distributions list as their own file (`claims`:
    each one's name -> (whether it ships that package's own bundle, `<package>._flytune`, and how many
    of its other modules it installs: `modules`)). Two claims of one file are ambiguity, never ownership
    by that claim alone: the one distribution that ships the package's bundle owns it, unless another
    installs more of the package (the package as a whole is that one's); where several ship one, none
    does; where none does, each one is a portion where the file is a pkgutil namespace stub
    (`extend_path`, `declare_namespace`), else none is."""
    bundled = [name for name, (ships, _) in claims.items() if ships]
    if len(bundled) == 1 and not any(n > claims[bundled[0]][1] for _, n in claims.values()):
        return (bundled[0],)
    return tuple(claims) if namespace and not bundled else ()


def contested(init: str, package: str, claimant: str, claims: Mapping[str, tuple[bool, int]],
              namespace: bool) -> str:
    """Why `claimant`'s claim on `init`, the `__init__.py` of `package` that every distribution of `claims`
    lists as its own, does not stand (`contest`); '' where it does."""
    owners = contest(claims, namespace)
    if claimant in owners:
        return ""
    names = " and ".join(sorted(claims))
    if owners:
        return (f"{init} is listed as its own file by {names}: two distributions claiming one file is ambiguity, "
                f"not ownership, and {owners[0]}, which ships package {package}'s own bundle, owns it")
    shipping = sorted(n for n, (ships, _) in claims.items() if ships)
    why = (f"{' and '.join(shipping)} each ship a bundle for package {package}" if len(shipping) > 1 else
           f"{shipping[0]} ships package {package}'s bundle but another installs more of it" if shipping else
           f"none ships package {package}'s own bundle")
    return (f"{init} is listed as its own file by {names}, and {why}: which of them owns {package} is ambiguous, "
            f"so none does (uninstall the one that should not be there)")


def packs_setting(raw: str) -> tuple[str, ...] | None:
    """FLYTUNE_PACKS: `*` (every pack), or comma-separated distribution names (normalised); None for a
    name that is no distribution name."""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if names == ("*",):
        return names
    if not all(DIST_NAME.fullmatch(n) for n in names):
        return None
    return tuple(sorted({normalize(n) for n in names}))


def pack_accepted(dist_name: str, accepted_by_owner: Iterable[str], opted_in: tuple[str, ...]) -> bool:
    """Whether a config pack shipped by `dist_name` may serve a kernel whose owner accepts the packs
    `accepted_by_owner` (`[tool.flytune] packs`), the user having opted into `opted_in` (FLYTUNE_PACKS)."""
    name = normalize(dist_name)
    return "*" in opted_in or name in opted_in or name in {normalize(n) for n in accepted_by_owner}


def served_level(tuned: DeviceIdentity, running: DeviceIdentity, accept) -> str | None:
    """The level an artifact tuned on `tuned` is served at on `running`; None when it is not served
    there (another arch, or a level its target does not accept)."""
    level = match_level(tuned, running)
    return level if level is not None and level in accept else None


def rank(source: tuple, level: str) -> tuple:
    """How one artifact ranks against another for the same key: lower wins. `source` is (USER | OWNER |
    PACK, the source's order among those)."""
    return (*source, LEVELS.index(level))


def best(groups: Iterable[tuple[tuple, list, list]]) -> dict:
    """key -> entry, the best-ranked entry per key, from groups of (rank, keys, entries); among equal
    ranks, the group given first, and within a group the first entry, wins."""
    ordered = sorted(enumerate(groups), key=lambda g: (g[1][0], g[0]), reverse=True)
    out: dict = {}
    for _, (_, keys, entries) in ordered:  # worst first: the best is written last
        out.update(zip(reversed(keys), reversed(entries)))
    return out


def conflict(files: Iterable[str], key: Mapping[str, Any]) -> str:
    """What the runtime says of artifact files of one identity and rank holding different configs for `key`
    (`n = 100` and `n = 100.0` are one key): neither serves, as `flytune verify` refuses the pair."""
    return (f"{' and '.join(map(str, files))}: one key ({dict(key)}) and different configs: neither is served "
            f"(`flytune verify` names the conflict)")


def config_time(provenance: Any, config: dict) -> float | None:
    """The time (ms) a tuning run measured for `config`, from the candidates its provenance records;
    None when it did not record one (or recorded no finite one)."""
    want = codec.canonical(config)
    for c in (provenance or {}).get("candidates") or ():
        t = c.get("time_ms") if isinstance(c, dict) else None
        if (isinstance(t, (int, float)) and not isinstance(t, bool) and -codec.FLOAT_MAX <= t <= codec.FLOAT_MAX
                and codec.canonical(c.get("config")) == want):
            return float(t)
    return None
