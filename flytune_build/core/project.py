"""`[tool.flytune]` in pyproject.toml: its rules declared once, as data (`TOOL_FLYTUNE`), from which
both the parser here and the JSON Schema validate-pyproject reads (`flytune_build.core.schema`) come.
Errors name the dotted key."""
from __future__ import annotations

import difflib
import fnmatch
import os
import posixpath
import re
import sys
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import codec
from .artifact import KERNEL_NAME, KERNEL_NAME_MAX
from .codec import FUNCTION, Fields, canonical
from .device import ARCH, NAME, backend_of
from .errors import NoProject, PlanError, ProjectError
from .fsutil import read_regular
from .schema.rules import (
    Array,
    Boolean,
    Choice,
    Either,
    Integer,
    Key,
    Number,
    Object,
    Parsed,
    Scalar,
    Table,
    Text,
)
from .serving import DIRNAME, DIST_NAME, normalize
from .specifier import SPECIFIER
from .target import DEFAULT_ACCEPT, LEVELS, Target, parse_targets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = "tool.flytune"
PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SETUP = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")  # module:attr, or module:attr.fn
MAX_PYPROJECT_BYTES = 4 << 20
WARMUP, REP = 25, 100  # ms per candidate, when `tune` does not say


def _targets(value: Any, f: Fields, path: str) -> tuple[Target, ...]:
    targets = parse_targets(value, f, path)
    if not targets:
        f.fail(path, "must name at least one target")
    return targets


PATH = Text(max_len=1024, min_len=1, forbid=(
    (r"\x00", "must not hold a NUL character"),
    (r"^(?:[/\\]|[A-Za-z]:)", "must be relative to the project root, not absolute ({value!r})"),
    (r"(?:^|[/\\])\.\.(?![^/\\])", "must stay under the project root: `..` is not allowed ({value!r})"),
), description="A path relative to the project root.")
KERNEL = Text(KERNEL_NAME.pattern, "a dotted kernel name", KERNEL_NAME_MAX)
ARCH_RULE = Text(ARCH.pattern, "an arch such as sm_90, gfx942 or interpreter")
# Targets are parsed by `target.parse_targets` (the manifest reads them too); this mirrors its rules
# for the schema. JSON Schema cannot say "no two targets with the same arch/units/name": uniqueItems
# refuses only identical entries.
TARGET = Either(ARCH_RULE, Table({
    "arch": Key(ARCH_RULE, required=True),
    "name": Key(Text(NAME.pattern, "printable ASCII, 1-128 characters", description="Product name to match.")),
    "units": Key(Integer(0, 100_000, description="SM or CU count to match.")),
    "accept": Key(Array(Choice(LEVELS), 1, "must name at least one match level",
                        description="Match levels served at run time."), default=list(DEFAULT_ACCEPT)),
}))
REFERENCE = Text(FUNCTION.pattern, "`module:function` (dotted Python names)",
                 description="A function called as the kernel is, writing the outputs every candidate's are "
                             "compared with (default: the kernel's default or first config).")


def _reference(value: Any, f: Fields, path: str) -> str:
    # a PlanError: `flytune tune` refuses the plan as a usage error (exit 2) before any job runs
    return REFERENCE.check(value, path, Fields(f.file, PlanError, f.root))


ENTRY = Table({
    "kernel": Key(KERNEL, required=True),
    "setup": Key(Text(SETUP.pattern, "`module:function`",
                      description="function(**shape) returns a zero-argument callable to time."), required=True),
    "shapes": Key(Array(Object(Scalar()), 1, "must list at least one shape"), required=True),
    "autotuner": Key(Text(SETUP.pattern, "`module:attribute` (or `module:attribute.fn`)",
                          description="A @triton.autotune kernel to capture, if not a flytune one.")),
    "rtol": Key(Number(0.0, 1e6, description="Relative tolerance of the output check (default: by dtype).")),
    "atol": Key(Number(0.0, 1e6, description="Absolute tolerance of the output check (default: by dtype).")),
    "check": Key(Boolean(description="false: candidates' outputs are not compared with the reference "
                                     "config's (a kernel whose outputs legitimately depend on its config)."),
                 default=True),
    "reference": Key(Parsed(_reference, REFERENCE.schema(), description=REFERENCE.description)),
})
PLACEHOLDERS = ("arch", "backend", "device")  # what an output template expands (`tuning.layout.expand`)
TEMPLATE = re.compile(r"(?:[^{}]|\{(?:%s)\})*" % "|".join(PLACEHOLDERS))


def check_output_template(value: str, f: Fields, path: str) -> str:
    """`value`, an output template (`tune.output`, `--output`), if each brace in it is one of a placeholder
    `{arch}`, `{backend}`, `{device}` (which expand per device); else `f`'s error naming the one that is
    not, with the placeholder meant where one is near. A typo never becomes a directory named `{arhc}`."""
    if TEMPLATE.fullmatch(value):
        return value
    known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
    for m in re.finditer(r"\{([^{}]*)\}|[{}]", value):
        word = m.group(1)
        if word is None:
            brace = m.group(0)
            f.fail(path, f"has a `{brace}` that {'no `}` closes' if brace == '{' else 'no `{` opens'} in {value!r}: "
                         f"the placeholders are {known}")
        if word not in PLACEHOLDERS:
            near = difflib.get_close_matches(word.lower(), PLACEHOLDERS, 1, 0.6)
            meant = f"did you mean `{{{near[0]}}}`? (" if near else "write one of "
            f.fail(path, f"has `{{{word}}}` in {value!r}, which is no placeholder: {meant}{known}, each expanded "
                         f"per device{')' if near else ''}")
    return value  # pragma: no cover (TEMPLATE and the loop agree)


def _output(value: Any, f: Fields, path: str) -> str:
    return check_output_template(PATH.check(value, path, f), f, path)


OUTPUT = Parsed(_output, {**PATH.schema(), "pattern": f"^{TEMPLATE.pattern}$"},
                description="Where `flytune tune` writes: {arch}, {backend} and {device} expand per device "
                            "(no other `{` or `}`); default: the first source.")
TUNE = Table({
    "plan": Key(replace(PATH, description="A TOML file of `[[entries]]`.")),
    "entries": Key(Array(ENTRY, description="The tuning plan, inline.")),
    "output": Key(OUTPUT),
    "warmup": Key(Integer(1, 10_000, description="Warm-up budget per candidate, ms."), default=WARMUP),
    "rep": Key(Integer(1, 100_000, description="Timing budget per candidate, ms."), default=REP),
}, exactly_one=("plan", "entries"), description="How `flytune tune` runs.")
TOOL_FLYTUNE = Table({
    "package": Key(Text(PACKAGE.pattern, "a dotted Python package name", description=(
        "Package the bundle goes into (<package>/_flytune/); inferred when there is one."))),
    "sources": Key(Array(PATH, 1, "must name at least one directory or glob",
                         description="Artifact directories or globs, relative to the project root."), required=True),
    "targets": Key(Parsed(_targets, {**Array(TARGET, 1).schema(), "uniqueItems": True},
                          description="Device targets: \"sm_90\" or { arch, name?, units?, accept? }."),
                   required=True),
    "coverage": Key(Either(Choice(("all", "none"), '"all", "none" or a list of kernel names'), Array(KERNEL),
                           description="Kernels that must have an artifact for every target."), default="all"),
    "triton": Key(Text(SPECIFIER, 'a PEP 440 version specifier such as ">=3.4,<4"',
                       description="PEP 440 specifier: the Triton versions the artifacts are valid for.")),
    "strict": Key(Boolean(description="false: bad artifacts are dropped with a warning."), default=True),
    "packs": Key(Array(Text(DIST_NAME.pattern, "a distribution name such as vendor-configs", 128),
                       description="Distributions whose config packs may serve this package's kernels, "
                                   "where its own bundle has no artifact."), default=[]),
    "tune": Key(TUNE),
}, description="flytune-build: pre-tuned kernel configs bundled into the wheel.")
PLAN = Table({"entries": Key(Array(ENTRY), required=True)})


@dataclass(frozen=True)
class TuneEntry:
    kernel: str
    setup: str               # "module:function"; function(**shape) returns a zero-argument callable
    shapes: tuple[dict, ...]
    autotuner: str | None = None  # "module:attr" of a @triton.autotune kernel to capture, if not ours
    rtol: float | None = None     # the output check's tolerances (None: by dtype, runtime.searching.outputs)
    atol: float | None = None
    check: bool = True            # False: candidates' outputs are not compared with the reference's
    # (file, dotted field) of the entry: the plan file or pyproject.toml, which an error names
    origin: tuple[str, str] | None = field(default=None, compare=False)
    reference: str | None = None  # "module:function" the outputs are compared with (None: a config's)

    @classmethod
    def from_checked(cls, entry: dict, origin: tuple[str, str] | None = None) -> TuneEntry:
        return cls(entry["kernel"], entry["setup"], tuple(entry["shapes"]), entry["autotuner"], entry["rtol"],
                   entry["atol"], entry["check"], origin, entry["reference"])


@dataclass(frozen=True)
class Project:
    root: Path
    package: str | None
    sources: tuple[str, ...]
    targets: tuple[Target, ...]
    coverage: str | tuple[str, ...]   # "all", "none", or named kernels
    triton: str | None                # a PEP 440 specifier set
    strict: bool
    tune_entries: tuple[TuneEntry, ...] = ()
    tune_plan: str | None = None
    tune_output: str | None = None
    tune_warmup: int = WARMUP
    tune_rep: int = REP
    name: str | None = None            # the distribution name, from [project]
    present: bool = field(default=True)
    packs: tuple[str, ...] = ()        # distributions (normalised names) whose config packs it accepts

    @property
    def tune_dir(self) -> Path:
        return self.root / (self.tune_output or self.sources[0])


def read_pyproject(root: str | Path) -> dict:
    """`root`'s pyproject.toml; where there is none, a ProjectError naming the nearest directory above that
    holds one (a command run from inside the package)."""
    path = Path(root) / "pyproject.toml"
    if not os.path.lexists(path):
        above = next((d for d in Path(os.path.abspath(root)).parents if (d / "pyproject.toml").is_file()), None)
        raise NoProject("does not exist: run flytune in the project's root, the directory that holds it" +
                        (f" (--project {above}; from Python, project={str(above)!r})" if above else ""), file=path)
    return read_toml(path)


def read_toml(path: Path) -> dict:
    """A TOML file flytune reads (pyproject.toml, a tuning plan): regular, capped (a FIFO never hangs),
    every failure a ProjectError naming it."""
    data = read_regular(path, ProjectError, MAX_PYPROJECT_BYTES)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProjectError(f"is not valid UTF-8 (byte {e.start})", file=path) from None
    except tomllib.TOMLDecodeError as e:
        if data.startswith(b"\xef\xbb\xbf"):
            raise ProjectError("starts with a UTF-8 byte-order mark, which TOML does not allow (pip and every build "
                               "backend refuse it too): save it as UTF-8 without one", file=path) from None
        raise ProjectError(f"is not valid TOML: {e}", file=path) from None
    except RecursionError:
        raise ProjectError("is not valid TOML: nested too deeply", file=path) from None
    except ValueError as e:   # Python refuses integers of more than `sys.get_int_max_str_digits()` digits
        raise ProjectError(f"is not valid TOML here: {codec.too_long(e)}", file=path) from None


def load(root: str | Path) -> Project | None:
    """The project's `[tool.flytune]`, or None when the table is absent."""
    root = Path(root).resolve()
    doc = read_pyproject(root)
    table = doc.get("tool", {}).get("flytune") if isinstance(doc.get("tool"), dict) else None
    if table is None:
        return None
    name = doc.get("project", {}).get("name") if isinstance(doc.get("project"), dict) else None
    try:
        proj = parse(table, root=root, file=root / "pyproject.toml", name=name if isinstance(name, str) else None,
                     doc=doc)
    except ProjectError as e:   # `[tool.flytun]` beside the `[tool.flytune.tune]` that makes [tool.flytune] exist
        close = misnamed(doc)
        if close is None or not _holds_missing(doc, close, e):
            raise
        raise ProjectError(f"is not a table flytune reads (did you mean `tool.flytune`?), so [tool.flytune] is "
                           f"incomplete (Field `{e.field}` {e.rule}): rename [{close}] to [tool.flytune]",
                           file=root / "pyproject.toml", field=close) from None
    check_owned(proj, doc)
    return proj


def parse(table: Any, *, root: Path, file: object = None, name: str | None = None, doc: dict | None = None) -> Project:
    """`table` checked as `[tool.flytune]`; `doc`, the whole pyproject.toml, tells where packages sit when
    `package` is inferred."""
    f = Fields(file, ProjectError, ROOT)
    v = TOOL_FLYTUNE.check(table, ROOT, f)
    package = v["package"] if v["package"] is not None else infer_package(root, f, doc)
    coverage = v["coverage"] if isinstance(v["coverage"], str) else tuple(v["coverage"])
    tune = v["tune"] or TUNE.defaults()
    entries = tuple(TuneEntry.from_checked(e, (str(file), f"{ROOT}.tune.entries[{i}]"))
                    for i, e in enumerate(tune["entries"] or ()))
    packs = tuple(sorted({normalize(p) for p in v["packs"]}))
    return Project(root, package, tuple(v["sources"]), v["targets"], coverage, v["triton"], v["strict"], entries,
                   tune["plan"], tune["output"], tune["warmup"], tune["rep"], name, packs=packs)


def _holds_missing(doc: dict, close: str, e: ProjectError) -> bool:
    """Whether `e` says a field of [tool.flytune] is required and the table `close` holds that field."""
    table: Any = doc
    for part in close.split("."):
        table = table.get(part) if isinstance(table, dict) else None
    name = str(e.field or "").rpartition(".")[2]
    return isinstance(table, dict) and name in table and str(e.rule).startswith("is required")


def _folded(name: str) -> str:
    """A table name as a reader who ignores case, spaces and look-alike forms sees it (NFKC: `ﬂ` is `fl`)."""
    return unicodedata.normalize("NFKC", name).casefold().strip()


TYPO = 0.8  # difflib's ratio from which a tool table is `flytune` misspelled (`flytun`, `flytnue`)


def misnamed(doc: dict) -> str | None:
    """The dotted name of the table in `doc` that is `[tool.flytune]` misnamed, where `doc` has no
    `[tool.flytune]` or an incomplete one (`load`): a `tool` key within a typo of `flytune` or starting with it (`flytune-build`), or
    a `flytune` table outside `tool` (`[tools.flytune]`, `[flytune]`); None where there is none."""
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    keys = {_folded(k): k for k in tool if k != "flytune" and isinstance(tool[k], dict)}  # `[tool.FLYTUNE]`, `ﬂytune`
    close = difflib.get_close_matches("flytune", keys, n=1, cutoff=TYPO) or \
        [k for k in keys if k.replace("-", "_").startswith("flytune")]
    if close:
        return f"tool.{keys[close[0]]}"
    if isinstance(doc.get("flytune"), dict):
        return "flytune"
    return next((f"{k}.flytune" for k, v in doc.items() if k != "tool" and isinstance(v, dict)
                 and isinstance(v.get("flytune"), dict)), None)


def load_plan(root: Path, plan: str | Path, repeats: bool = True) -> tuple[TuneEntry, ...]:
    """The entries of a plan file (the build reads it for coverage; `flytune tune` to tune); `repeats`
    False leaves a repeated shape to the caller (`check_repeats`: the build, which tunes nothing, warns)."""
    plan_file = Path(root) / plan
    if not os.path.lexists(plan_file):
        raise ProjectError("does not exist (tool.flytune.tune.plan names it): `flytune init` writes one for the "
                           "package's kernels, with the setups it names", file=plan_file)
    doc = PLAN.check(read_toml(plan_file), "", Fields(plan_file, ProjectError))
    entries = tuple(TuneEntry.from_checked(e, (str(plan_file), f"entries[{i}]")) for i, e in enumerate(doc["entries"]))
    if repeats:
        check_repeats(entries)
    return entries


def shape_text(shape: dict) -> str:
    """A plan's shape as reports print it: `n=64,dtype=float16`."""
    return ",".join(f"{k}={v}" for k, v in shape.items())


def check_repeats(entries) -> None:
    """A PlanError where a plan names one job twice: a shape repeated in an entry, or in another entry of
    the same kernel and setup (one search, its two rows each the other's duplicate). It names the field of
    each repeat and the shape it repeats. A plan file is checked as it is read (`load_plan`); the inline
    entries where they are used (the build's coverage, `flytune tune`), the table's JSON Schema being
    unable to say it."""
    first: dict[tuple, str] = {}
    repeats = []
    for entry in entries:
        file, path = entry.origin
        for i, shape in enumerate(entry.shapes):
            field_ = f"{path}.shapes[{i}]"
            seen = first.setdefault((entry.kernel, entry.setup, canonical(shape)), field_)
            if seen != field_:
                repeats.append((file, field_, seen, shape))
    if repeats:
        (file, field_, seen, shape), rest = repeats[0], repeats[1:]
        more = "".join(f"; `{f}` repeats `{s}`" for _, f, s, _ in rest)
        raise PlanError(f"repeats `{seen}` ({shape_text(shape)}): one search, two rows{more}; remove the "
                        f"repeat{'s' if rest else ''} from the plan", file=file, field=field_)


def infer_package(root: Path, f: Fields, doc: dict | None = None) -> str:
    """The single top-level package of the project, by the name it is imported as: a directory holding an
    `__init__.py` under the root, src/ or the directory setuptools' `package-dir` takes packages from
    (`"" = "lib"`); a directory `package-dir` maps a package to (`mylib = "lib"`) is that package, never
    one named after the directory."""
    mapped = setuptools_package_dir(doc or {})
    found = {name for name, d in mapped.items()
             if name.isidentifier() and (root / d / "__init__.py").is_file()}  # dotted: a subpackage
    taken = {os.path.realpath(root / d) for name, d in mapped.items() if name}
    for base in dict.fromkeys((root, root / "src", root / mapped.get("", "."))):
        if base.is_dir():
            for d in sorted(base.iterdir()):
                if d.is_dir() and (d / "__init__.py").is_file() and d.name.isidentifier() \
                        and d.name not in ("tests", "test", "docs", "build", "dist") \
                        and os.path.realpath(d) not in taken:
                    found.add(d.name)
    if len(found) != 1:
        f.fail(f.path("package"), "is required: cannot infer it "
               + ("(no package found)" if not found else f"(several packages: {', '.join(sorted(found))})"))
    return found.pop()


def setuptools_package_dir(doc: dict) -> dict[str, str]:
    """`[tool.setuptools.package-dir]`, its string entries: package name ("" for the root of all
    packages) -> directory relative to the project root."""
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    setuptools_tool = tool.get("setuptools") if isinstance(tool.get("setuptools"), dict) else {}
    table = setuptools_tool.get("package-dir")
    return {k: v for k, v in table.items() if isinstance(v, str)} if isinstance(table, dict) else {}


def check_owned(proj: Project, doc: dict) -> None:
    """A ProjectError unless the project holds `package` itself: its directory, under the project root
    or a directory the build backend is told to take packages from, holds a Python module (beside any
    `_flytune/`). A bundle goes only into the project's own package, never into `numpy/`."""
    if proj.package is None:
        return
    top, _, rest = proj.package.partition(".")
    for base in package_bases(proj.root, doc, top):
        d = os.path.join(base, *rest.split(".")) if rest else base
        real = os.path.realpath(d)
        if not _inside(real, str(proj.root)):
            continue
        try:
            names = [e.name for e in os.scandir(real) if e.is_file() and e.name != DIRNAME]
        except OSError:
            continue
        if any(n.endswith((".py", ".pyi", ".so", ".pyd")) for n in names):
            return
    raise ProjectError(f"names package {proj.package!r}, which this project does not hold: no "
                       f"{proj.package.replace('.', '/')}/ with a Python module under the project root, src/ or the "
                       f"package directories its build backend declares (a bundle goes only into the project's own "
                       f"package)", file=proj.root / "pyproject.toml", field=f"{ROOT}.package")


def package_bases(root: Path, doc: dict, top: str) -> list[str]:
    """Where the top-level package `top` may sit in the project: the directories a flat or src layout,
    setuptools (`package-dir`, `packages.find.where`), hatchling (`targets.wheel.packages`), maturin
    (`python-source`) or pdm (`package-dir`) take packages from, each joined with `top`."""
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}

    def get(*path):
        node = tool
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        return node

    dirs = [".", "src"]
    pkg_dir = setuptools_package_dir(doc)
    if top in pkg_dir:  # the top-level package mapped to a directory of its own
        return [os.path.join(root, pkg_dir[top])]
    if "" in pkg_dir:
        dirs.append(pkg_dir[""])
    where = get("setuptools", "packages", "find", "where")
    dirs += [w for w in where if isinstance(w, str)] if isinstance(where, list) else []
    hatch = get("hatch", "build", "targets", "wheel", "packages")
    if isinstance(hatch, list):
        dirs += [os.path.dirname(p.rstrip("/")) or "." for p in hatch
                 if isinstance(p, str) and os.path.basename(p.rstrip("/")) == top]
    for value in (get("maturin", "python-source"), get("pdm", "build", "package-dir")):
        if isinstance(value, str):
            dirs.append(value)
    return [os.path.join(root, d, top) for d in dict.fromkeys(dirs)]


def _inside(real: str, root: str) -> bool:
    top = os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def ships(root: str | Path, sources, directory: str | Path) -> bool:
    """Whether the build would collect what is written into `directory`: it is one of `sources`
    (`[tool.flytune] sources`, relative to `root`), lies below one, or one of its folders matches a
    source glob (`*`, `?`, `[...]`, `**`), as `core.fsutil.find` reads them."""
    try:
        rel = Path(os.path.realpath(directory)).relative_to(os.path.realpath(root))
    except ValueError:
        return False  # outside the project: never collected
    parts = [p for p in rel.parts if p not in ("", ".")]
    for source in sources:
        segs = [s for s in source.replace("\\", "/").split("/") if s not in ("", ".")]
        while segs and segs[-1] == "**":  # `dir/**` reaches what walking `dir` reaches
            segs.pop()
        if any(_matches(segs, parts[:n]) for n in range(len(parts) + 1)) or \
                _matches(segs, parts + ["kernel-0000000000000000.json"]):  # a glob of artifact files
            return True
    return False


def _matches(segs: list[str], parts: list[str]) -> bool:
    if not segs:
        return not parts
    if segs[0] == "**":
        return any(_matches(segs[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], segs[0]) and _matches(segs[1:], parts[1:])


def unshipped_fix(root: str | Path, sources, directory: str | Path) -> str:
    """What to do about a tune output `directory` that `ships` says no source reaches: tune under a source,
    or (inside the project) add the output's top directory to `sources`."""
    under = next((s for s in map(_plain, sources) if s and not os.path.isfile(Path(root) / s)), None)  # a directory
    move = f'`output = "{under}/{{arch}}"`' if under else "an `output` under a directory the sources name"
    try:
        rel = Path(os.path.realpath(directory)).relative_to(os.path.realpath(root))
    except ValueError:
        return f"tune into a directory under the sources instead ({move} in [tool.flytune.tune], or --output)"
    top = rel.parts[0] if rel.parts else "."
    return f"move the output under a source ({move} in [tool.flytune.tune]), or add {top!r} to [tool.flytune] sources"


def unshipped_output_error(proj: Project) -> ProjectError | None:
    """The error (a warning where `strict = false`) of a `tune.output` no source reaches: what, where, and
    what to do; None where every target's output ships."""
    unshipped = unshipped_tune_output(proj)
    if unshipped is None:
        return None
    return ProjectError(f"is {proj.tune_output!r}, which writes {unshipped}: outside the sources "
                        f"({', '.join(proj.sources)}), so the build never ships what `flytune tune` writes there: "
                        f"{unshipped_fix(proj.root, proj.sources, proj.root / unshipped)}",
                        file=proj.root / "pyproject.toml", field="tool.flytune.tune.output")


_MAGIC = frozenset("*?[")


def _plain(source: str) -> str | None:
    """A source as the directory it names (`artifacts/**` is `artifacts`); None for a glob."""
    slashed = source.replace("\\", "/")
    text = posixpath.normpath(slashed) if source and ".." not in slashed.split("/") else ""
    while text.endswith("/**"):
        text = text[:-3]
    return text if text and text != "." and not _MAGIC.intersection(text) else None


def unshipped_tune_output(proj: Project) -> str | None:
    """The `tune.output` directory (expanded for each target's arch) that `sources` does not reach, if any:
    `flytune tune` would write there and the build would keep shipping what the sources hold."""
    if not proj.tune_output:
        return None
    for target in proj.targets:
        text = proj.tune_output
        for placeholder, value in (("{arch}", target.arch), ("{backend}", backend_of(target.arch)),
                                   ("{device}", "device")):
            text = text.replace(placeholder, value)
        if not ships(proj.root, proj.sources, proj.root / text):
            return text
    return None
