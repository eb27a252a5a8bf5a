"""`[tool.flytune]` in pyproject.toml: parsed and validated whole, errors name the dotted key."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifact import KERNEL_NAME
from .codec import Fields
from .errors import ProjectError
from .target import Target, parse_targets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = "tool.flytune"
KEYS = ("package", "sources", "targets", "coverage", "triton", "strict", "tune")
TUNE_KEYS = ("plan", "entries", "output", "warmup", "rep")
PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SETUP = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
MAX_PYPROJECT_BYTES = 4 << 20


@dataclass(frozen=True)
class TuneEntry:
    kernel: str
    setup: str               # "module:function"; function(**shape) returns a zero-argument callable
    shapes: tuple[dict, ...]
    autotuner: str | None = None  # "module:attr" of a @triton.autotune kernel to capture, if not ours


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
    tune_warmup: int = 25
    tune_rep: int = 100
    name: str | None = None            # the distribution name, from [project]
    present: bool = field(default=True)

    @property
    def tune_dir(self) -> Path:
        return self.root / (self.tune_output or self.sources[0])


def read_pyproject(root: str | Path) -> dict:
    path = Path(root) / "pyproject.toml"
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ProjectError(f"cannot be read: {e.strerror}", file=path) from None
    if len(data) > MAX_PYPROJECT_BYTES:
        raise ProjectError(f"is over the {MAX_PYPROJECT_BYTES}-byte cap", file=path)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProjectError(f"is not valid UTF-8 (byte {e.start})", file=path) from None
    except tomllib.TOMLDecodeError as e:
        raise ProjectError(f"is not valid TOML: {e}", file=path) from None
    except RecursionError:
        raise ProjectError("is not valid TOML: nested too deeply", file=path) from None


def load(root: str | Path) -> Project | None:
    """The project's `[tool.flytune]`, or None when the table is absent."""
    root = Path(root).resolve()
    doc = read_pyproject(root)
    table = doc.get("tool", {}).get("flytune") if isinstance(doc.get("tool"), dict) else None
    if table is None:
        return None
    name = doc.get("project", {}).get("name") if isinstance(doc.get("project"), dict) else None
    return parse(table, root=root, file=root / "pyproject.toml", name=name if isinstance(name, str) else None)


def parse(table: Any, *, root: Path, file: object = None, name: str | None = None) -> Project:
    f = Fields(file, ProjectError, ROOT)
    p = f.path
    f.table(table, ROOT, ("sources", "targets"), KEYS)
    package = table.get("package")
    if package is not None:
        f.string(package, p("package"), PACKAGE, "a dotted Python package name")
    else:
        package = infer_package(root, f)
    sources = tuple(f.array(table["sources"], p("sources"), lambda v, path: _source(v, path, f)))
    if not sources:
        f.fail(p("sources"), "must name at least one directory or glob")
    targets = parse_targets(table["targets"], f, p("targets"))
    if not targets:
        f.fail(p("targets"), "must name at least one target")
    coverage = table.get("coverage", "all")
    if isinstance(coverage, str):
        if coverage not in ("all", "none"):
            f.fail(p("coverage"), f"must be \"all\", \"none\" or a list of kernel names, not {coverage!r}")
    else:
        coverage = tuple(f.array(coverage, p("coverage"), lambda v, path: f.string(
            v, path, KERNEL_NAME, "a dotted kernel name", 200)))
    triton = table.get("triton")
    if triton is not None:
        f.string(triton, p("triton"))
        _specifier(triton, f, p("triton"))
    strict = f.boolean(table.get("strict", True), p("strict"))
    entries, plan, output, warmup, rep = (), None, None, 25, 100
    if "tune" in table:
        entries, plan, output, warmup, rep = _tune(table["tune"], root, f)
    return Project(root, package, sources, targets, coverage, triton, strict, entries, plan, output, warmup, rep,
                   name)


def _source(value: Any, path: str, f: Fields) -> str:
    f.string(value, path, max_len=1024)
    if not value or "\x00" in value:
        f.fail(path, "must be a non-empty relative path")
    if value.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", value):
        f.fail(path, f"must be relative to the project root, not absolute ({value!r})")
    if ".." in re.split(r"[\\/]", value):
        f.fail(path, f"must stay under the project root: `..` is not allowed ({value!r})")
    return value


def _specifier(text: str, f: Fields, path: str):
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        f.fail(path, f"must be a PEP 440 version specifier such as \">=3.4,<4\", not {text!r}")


def _tune(value: Any, root: Path, f: Fields):
    p = f.path
    f.table(value, p("tune"), (), TUNE_KEYS)
    if ("plan" in value) == ("entries" in value):
        f.fail(p("tune"), "must have exactly one of `plan` (a TOML file) or `entries`")
    output = value.get("output")
    if output is not None:
        _source(output, p("tune", "output"), f)
    warmup = f.integer(value.get("warmup", 25), p("tune", "warmup"), 1, 10_000)
    rep = f.integer(value.get("rep", 100), p("tune", "rep"), 1, 100_000)
    if "plan" in value:
        plan = _source(value["plan"], p("tune", "plan"), f)
        return (), plan, output, warmup, rep
    return _entries(value["entries"], f, p("tune", "entries")), None, output, warmup, rep


def load_plan(root: Path, plan: str | Path) -> tuple[TuneEntry, ...]:
    """The entries of a plan file (read only when tuning: a build never needs it)."""
    plan_file = Path(root) / plan
    try:
        doc = tomllib.loads(plan_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ProjectError(f"cannot be read: {e}", file=plan_file) from None
    except tomllib.TOMLDecodeError as e:
        raise ProjectError(f"is not valid TOML: {e}", file=plan_file) from None
    pf = Fields(plan_file, ProjectError)
    pf.table(doc, "", ("entries",))
    return _entries(doc["entries"], pf, "entries")


def _entries(values: Any, f: Fields, path: str) -> tuple[TuneEntry, ...]:
    def entry(v, at):
        f.table(v, at, ("kernel", "setup", "shapes"), ("autotuner",))
        kernel = f.string(v["kernel"], f"{at}.kernel", KERNEL_NAME, "a dotted kernel name", 200)
        setup = f.string(v["setup"], f"{at}.setup", SETUP, "`module:function`")

        def shape(s, sp):
            f.mapping(s, sp)
            for k, val in s.items():
                f.scalar(val, f"{sp}.{k}")
            return dict(s)

        shapes = tuple(f.array(v["shapes"], f"{at}.shapes", shape))
        if not shapes:
            f.fail(f"{at}.shapes", "must list at least one shape")
        autotuner = v.get("autotuner")
        if autotuner is not None:
            f.string(autotuner, f"{at}.autotuner", SETUP, "`module:attribute`")
        return TuneEntry(kernel, setup, shapes, autotuner)

    return tuple(f.array(values, path, entry))


def infer_package(root: Path, f: Fields) -> str:
    """The single top-level package under the root (flat or src layout)."""
    found = []
    for base in (root, root / "src"):
        if base.is_dir():
            for d in sorted(base.iterdir()):
                if d.is_dir() and (d / "__init__.py").is_file() and d.name.isidentifier() \
                        and d.name not in ("tests", "test", "docs", "build", "dist"):
                    found.append(d.name)
    if len(found) != 1:
        f.fail(f.path("package"), "is required: cannot infer it "
               + ("(no package found)" if not found else f"(several packages: {', '.join(found)})"))
    return found[0]
