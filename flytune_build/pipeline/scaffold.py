"""`flytune init`: an existing package's `[tool.flytune]`, tuning plan and setups, from its source (read,
never imported: `discovery`).

Invariants: `init` is all or nothing. Every file is made in memory and read back first (pyproject.toml
as what it held plus exactly the tables appended, the plan as a plan, the setups module as Python whose
names shadow neither its imports nor each other), every path is checked, then each file is written
atomically, and a write that fails undoes the others: the project is as it was. An existing
`[tool.flytune]` or plan is replaced only with `force`, the setups module never (in any form the package
holds it: a `tuning/` too, which an import would load instead); pyproject.toml is only appended to, in its
own line endings, so what was there stays byte for byte, but a `force`d [tool.flytune], which tomlkit
takes out however it is written, writing back the rest as it read it.
"""
from __future__ import annotations

import ast
import builtins
import importlib.machinery
import keyword
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..core import fsutil
from ..core import project as project_mod
from ..core.artifact import KERNEL_NAME, KERNEL_NAME_MAX
from ..core.codec import Fields
from ..core.errors import InputError, OutputError, ProjectError, UsageError
from ..core.fsutil import atomic_write
from ..core.target import parse_targets
from . import pyproject_text as toml_text
from .discovery import FoundKernel, find_kernels, top_level_names

PLAN = "tune/plan.toml"
OUTPUT = "artifacts/{arch}"
SOURCES = "artifacts"
SETUPS = "tuning"  # the module of setups, inside the package
# setuptools backends find packages on their own, and a flat layout with artifacts/ and tune/ beside
# the package is "several top-level packages" to them: the one layout that needs `packages.find`
SETUPTOOLS_BACKENDS = (None, "setuptools.build_meta", "setuptools.build_meta:__legacy__", "flytune_build.backend")
DEFAULT_SIZE = 1024


@dataclass
class Scaffold:
    """What `init` found and will write: `files` (path -> text; pyproject.toml in full), `actions` (one
    line each, in the order written), `todo` (what the author still does by hand) and `commands`."""

    root: Path
    package: str
    kernels: list[FoundKernel]
    files: dict[Path, str] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    read: dict[Path, bytes] = field(default_factory=dict)  # what a file to rewrite held when planned


def scaffold(root: str | Path = ".", *, package: str | None = None, targets: tuple | None = None,
             force: bool = False) -> Scaffold:
    """What `init` writes for the project at `root`: checks everything, writes nothing. An InputError
    (a ProjectError for pyproject.toml itself) names what is in the way and what to do. `targets` None:
    those of the table `force` replaces, where it declares valid ones, else the interpreter."""
    root = Path(root).resolve()
    if targets is not None:
        parse_targets(list(targets), Fields(None, UsageError), "--target")  # the rule [tool.flytune] targets follow
    pyproject = root / "pyproject.toml"
    if not root.is_dir():
        raise InputError(f"{'is not a directory' if os.path.lexists(root) else 'does not exist'}: pass --project the "
                         f"directory that holds the package's pyproject.toml", file=root)
    if not os.path.lexists(pyproject):
        raise InputError("has no pyproject.toml: `flytune init` configures an existing package; write its "
                         "[project] table first (or pass --project DIR)", file=root)
    doc = project_mod.read_toml(pyproject)  # capped, UTF-8 and TOML checked: the text below is read once more
    text = pyproject.read_bytes().decode("utf-8")  # not read_text: its newline translation would rewrite CRLF
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    targets = targets if targets is not None else _kept_targets(tool) if force else ("interpreter",)
    if package is None:
        try:
            package = project_mod.infer_package(root, Fields(pyproject, ProjectError, project_mod.ROOT), doc)
        except ProjectError as e:
            found = e.rule.removeprefix("is required: cannot infer it ")
            raise InputError(f"cannot tell which package to configure {found}: pass --package NAME",
                             file=root) from None
        field_hint = ""
        if not PACKAGE_NAME.fullmatch(package):  # a name Python imports, but not one a bundle's table may hold
            raise InputError(f"package {package!r} is named with characters [tool.flytune] `package` does not take "
                             f"(ASCII letters, digits and _, dotted): rename it, or pass --package NAME",
                             file=root)
    else:
        field_hint = " (--package)"
        if not isinstance(package, str) or not PACKAGE_NAME.fullmatch(package):
            raise InputError(f"must be a dotted Python package name (mylib, or mylib.ops), not {package!r}",
                             file=root, field="--package")
    package_dir = _package_dir(root, doc, package)
    if package_dir is None:
        raise InputError(f"package {package!r}{field_hint} is not under the project root or src/: no "
                         f"{package.replace('.', '/')}/__init__.py", file=root)

    unread: list[tuple[Path, int | None, str]] = []
    kernels, left_out = _plannable(root, find_kernels(package_dir, package, unread))
    left_out[:0] = [f"{path.relative_to(root).as_posix()}{f':{line}' if line else ''}: {why}, so any kernel it "
                    f"declares is not in {PLAN}: fix it, then run `flytune init --force` (or add its kernels to "
                    f"the plan by hand)" for path, line, why in unread]
    s = Scaffold(root, package, kernels, todo=left_out, read={pyproject: text.encode("utf-8")})
    base, before = _without_tool_flytune(s, pyproject, text, doc, tool, force)
    blocks = [("tool.flytune", _tool_flytune(s, targets))] + _packaging(s, root, doc, package_dir)
    s.files[pyproject] = _appended(s, pyproject, base, before, blocks)
    _plan_file(s, force, unread=bool(unread))
    _setups_module(s, package_dir)
    _next_steps(s, doc, targets)
    return s


def write(s: Scaffold) -> None:
    """Write what `scaffold` planned, all or nothing. Every path is checked first (an InputError naming what
    is in the way and what to do; nothing written), then each file is written atomically, keeping a
    replaced file's mode; a failed write undoes the others, and an OutputError names it and what to do."""
    staged = [(path, text.encode("utf-8")) for path, text in s.files.items()]
    for path, _ in staged:
        _check_path(s.root, path)
    # new files first, then those replaced, pyproject.toml last: what an interrupted run (a kill, no undo)
    # leaves is at worst files the next `init` may replace, never a [tool.flytune] it refuses to
    staged.sort(key=lambda item: (item[0] == s.root / "pyproject.toml", os.path.lexists(item[0])))
    made: list[Path] = []                                 # directories this call created
    done: list[tuple[Path, bytes | None, int]] = []       # (file, what it held before or None, its mode)
    try:
        for path, data in staged:
            _make_directories(path.parent, made)
            if path in s.read:  # appended to: what was planned from must still be there, never overwritten
                fsutil.unchanged(path, s.read[path])
            old = fsutil.read_regular(path, OutputError, MAX_KEPT_BYTES) if os.path.lexists(path) else None
            mode = stat.S_IMODE(path.stat().st_mode) if old is not None else 0o644
            atomic_write(path, data, mode)
            done.append((path, old, mode))
    except BaseException as e:
        left = _undo(done, made)
        if not isinstance(e, (OSError, OutputError)):
            raise
        where = e.file if isinstance(e, OutputError) and e.file else getattr(e, "filename", None) or s.root
        why = e.rule if isinstance(e, OutputError) else f"cannot be written: {e.strerror or e}"
        undone = ("`flytune init` undid what it had written (the project is as it was)" if not left else
                  f"`flytune init` could not undo all it had written ({'; '.join(left)})")
        raise OutputError(f"{why}; {undone}: free space on its disk or make its directory writable, then run "
                          f"`flytune init` again", file=where) from None


def _writable(path: Path) -> bool:
    """Whether this process may write `path`, and its mode says anyone may: root ignores the mode, but
    a file or directory made read-only says not to write it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    wanted = os.W_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)
    return os.access(path, wanted) and bool(mode & 0o222)


def _check_path(root: Path, path: Path) -> None:
    """An InputError naming what is in the way of writing `path` (nothing is written), or nothing."""
    rel = path.relative_to(root).as_posix()  # `scaffold` plans every file under the root
    again = "then run `flytune init` again; nothing was written"
    if path.is_symlink() or not path.resolve().is_relative_to(root.resolve()):
        raise InputError("is a symlink, or reached through one that leaves the project: `flytune init` "
                         "wrote nothing (write it by hand, or replace the link with a file)", file=path)
    directory = root
    for part in Path(rel).parts[:-1]:
        directory = directory / part
        if os.path.lexists(directory) and not directory.is_dir():
            raise InputError(f"is a file where `flytune init` needs a directory, for {rel}: move it aside (or "
                             f"remove it), {again}", file=directory)
    nearest = path.parent
    while not os.path.lexists(nearest):
        nearest = nearest.parent
    if not _writable(nearest):
        raise InputError(f"is not writable, and `flytune init` writes {rel} "
                         f"{'there' if nearest == path.parent else 'below it'}: make it writable "
                         f"(chmod u+w {nearest.relative_to(root).as_posix() or '.'}), {again}", file=nearest)
    if os.path.lexists(path):
        if not path.is_file():
            raise InputError(f"is not a regular file, and `flytune init` writes a file there: move it aside, "
                             f"{again}", file=path)
        if not _writable(path):
            how = "appends to" if path.name == "pyproject.toml" else "replaces"
            raise InputError(f"is read-only, and `flytune init` {how} it: make it writable (chmod u+w {rel}), "
                             f"{again}", file=path)


def _make_directories(directory: Path, made: list[Path]) -> None:
    """Create `directory` and the parents it lacks, each added to `made` (outermost first)."""
    for d in reversed([d for d in (directory, *directory.parents) if not os.path.lexists(d)]):
        try:
            d.mkdir()
        except OSError as e:
            raise OutputError(f"cannot be created: {e.strerror or e}", file=d) from None
        made.append(d)


def _undo(done: list[tuple[Path, bytes | None, int]], made: list[Path]) -> list[str]:
    """Put back what `write` changed: replaced files restored, new files and directories removed, the
    last first. Returns what could not be put back, in words (nothing: the project is as it was)."""
    left = []
    for path, old, mode in reversed(done):
        try:
            if old is None:
                os.unlink(path)
            else:
                atomic_write(path, old, mode)
        except OSError as e:
            left.append(f"{path}: {e}")
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError as e:
            left.append(f"{d}: {e.strerror or e}")
    return left


MAX_KEPT_BYTES = 64 << 20    # a file `write` replaces, held in memory to be put back if a later write fails
PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _plannable(root: Path, kernels: list[FoundKernel]) -> tuple[list[FoundKernel], list[str]]:
    """(the kernels a plan can name, each with its setup's name; what to do about those it cannot): a
    kernel of a module no import reaches by name (`my-ops.py`), whose name the source does not spell out
    (`name=f(...)`), whose name is no dotted kernel name (its artifacts would be refused) or is another
    kernel's (their artifacts would mix), is left out of the plan, said in the list of what to do by hand."""
    kept, left_out = [], []
    first: dict[str, FoundKernel] = {}
    for k in kernels:
        where = f"{k.where(root)}: {k.function} is left out of {PLAN}"
        if not all(IDENTIFIER.fullmatch(p) and not keyword.iskeyword(p) for p in k.module.split(".")):
            left_out.append(f"{where}: its module {k.module!r} cannot be imported by that name (rename the file "
                            f"to a Python identifier, then add the kernel to the plan)")
        elif k.name is None:
            left_out.append(f"{where}: its name= is neither a string literal nor a string constant its module "
                            f"binds once, so `flytune init` cannot read it without running the module (write the "
                            f"name as a literal, or add the kernel to the plan by the name it has)")
        elif k.name in first:
            left_out.append(f"{where}: its name {k.name!r} is the name of {first[k.name].function} "
                            f"({first[k.name].where(root)}) too, and two kernels never share one (their artifacts "
                            f"would serve each other): rename one, then add it to the plan")
        elif not KERNEL_NAME.fullmatch(k.name) or len(k.name) > KERNEL_NAME_MAX:
            left_out.append(f"{where}: its name {k.name!r} is no dotted kernel name such as {k.module}.add "
                            f"(rename it, then add it to the plan)")
        else:
            kept.append(k)
        first.setdefault(k.name, k)
    return _name_setups(kept), left_out


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # ASCII: a plan's `setup` takes no other
SETUP_IMPORTS = ("os", "torch")  # what the setups module imports besides the kernels' modules
DEVICE_HELPER = ("device", "input_device", "inputs_device")  # the setups module's helper, by preference


def _imported(kernels: list[FoundKernel]) -> set[str]:
    """The names the setups module imports (its kernels' top-level packages too), and the builtins a
    name of its own would shadow."""
    return set(SETUP_IMPORTS) | {k.module.split(".")[0] for k in kernels} | set(dir(builtins))


def _free(candidates: tuple[str, ...], taken: set[str]) -> str:
    """The first candidate that is a plain identifier, no keyword and not taken; else the last one
    numbered (`add_setup_2`)."""
    for name in candidates:
        if IDENTIFIER.fullmatch(name) and not keyword.iskeyword(name) and name not in taken:
            return name
    stem = next((c for c in reversed(candidates) if IDENTIFIER.fullmatch(c)), "setup")
    n = 2
    while f"{stem}_{n}" in taken:
        n += 1
    return f"{stem}_{n}"


def _name_setups(kernels: list[FoundKernel]) -> list[FoundKernel]:
    """Each kernel with its setup function's name: its function's name less a `_kernel` suffix, unless
    that is taken (an import of the setups module, a builtin, its device helper: `add_setup`; another
    kernel's setup: `<module>_add`)."""
    reserved = _imported(kernels) | {_free(DEVICE_HELPER, _imported(kernels))}
    named: set[str] = set()
    out = []
    for k in kernels:
        base = k.function.removesuffix("_kernel") or k.function
        mod = k.module.rsplit(".", 1)[-1]
        then = (f"{mod}_{base}", f"{base}_setup") if base in named else (f"{base}_setup", f"{mod}_{base}")
        setup = _free((base, *then, f"{mod}_{base}_setup"), reserved | named)
        named.add(setup)
        out.append(FoundKernel(k.name, k.function, k.module, k.file, k.line, k.adopted, k.registered, k.axes, setup))
    return out


def _package_dir(root: Path, doc: dict, package: str) -> Path | None:
    top = package.split(".")[0]
    rest = package.split(".")[1:]
    for base in project_mod.package_bases(root, doc, top):
        d = Path(base, *rest)
        if (d / "__init__.py").is_file():
            return d
    return None


def _without_tool_flytune(s: Scaffold, pyproject: Path, text: str, doc: dict, tool: dict,
                          force: bool) -> tuple[str, dict]:
    """(pyproject.toml's text that [tool.flytune] is appended to, what it parses to): the file as it is,
    or, with `force`, less the [tool.flytune] tables it holds (`pyproject_text.without`)."""
    if "flytune" not in tool:
        s.actions.append(f"appended [tool.flytune] to {pyproject.name}")
        return text, doc
    if not force:
        raise ProjectError("already has a [tool.flytune] table; `flytune init` wrote nothing (--force replaces "
                           "it, and the plan file)", file=pyproject)
    before = {**doc}
    before["tool"] = {k: v for k, v in tool.items() if k != "flytune"}
    before = {k: v for k, v in before.items() if k != "tool" or v}
    kept = toml_text.without(text, ("tool", "flytune"))
    if kept is None or not toml_text.reads_as(kept, before):  # the rest must read as exactly what it was
        raise ProjectError("holds [tool.flytune] in a form `flytune init --force` cannot take out and leave the rest "
                           "as it was; remove [tool.flytune] by hand and run `flytune init` again", file=pyproject)
    s.actions.append(f"replaced [tool.flytune] in {pyproject.name} (--force)")
    return kept, before


def _kept_targets(tool: dict) -> tuple:
    """The targets of the [tool.flytune] `--force` replaces, where they are valid; else the interpreter."""
    kept = tool["flytune"].get("targets") if isinstance(tool.get("flytune"), dict) else None
    try:
        return tuple(kept) if parse_targets(kept, Fields(None, InputError), "targets") else ("interpreter",)
    except (InputError, TypeError, AttributeError):
        return ("interpreter",)


def _tool_flytune(s: Scaffold, targets: tuple) -> str:
    target_list = ", ".join(toml_text.value(t) for t in targets)
    return (f'\n[tool.flytune]\npackage = "{s.package}"\nsources = ["{SOURCES}"]\n'
            f'# one per device you ship for; a GPU: {{ arch = "sm_90", name = "NVIDIA H200", units = 132 }}\n'
            f'targets = [{target_list}]\n\n'
            f'[tool.flytune.tune]\nplan = "{PLAN}"\noutput = "{OUTPUT}"\n')


def _appended(s: Scaffold, pyproject: Path, base: str, before: dict, blocks: list[tuple[str, str]]) -> str:
    """`base` with each (table, block) appended and read back (`pyproject_text.appended`), and its
    [tool.flytune] as the build will read it."""
    text = toml_text.appended(pyproject, base, before, blocks)
    doc = project_mod.tomllib.loads(text)
    name = doc.get("project", {}).get("name") if isinstance(doc.get("project"), dict) else None
    proj = project_mod.parse(doc["tool"]["flytune"], root=s.root, file=pyproject,
                             name=name if isinstance(name, str) else None, doc=doc)
    project_mod.check_owned(proj, doc)
    return text


def _packaging(s: Scaffold, root: Path, doc: dict, package_dir: Path) -> list[tuple[str, str]]:
    """The tables the build needs appended (each (table, block)), and what is left to do by hand."""
    blocks = []
    system = doc.get("build-system") if isinstance(doc.get("build-system"), dict) else None
    backend = system.get("build-backend") if system else None
    if system is None:
        blocks.append(("build-system", '\n[build-system]\nrequires = ["setuptools>=70", "flytune-build"]\n'
                                       'build-backend = "flytune_build.backend"\n'))
        s.actions.append("appended [build-system]: setuptools with flytune_build.backend")
        backend = "flytune_build.backend"
    elif backend in ("setuptools.build_meta", "setuptools.build_meta:__legacy__"):
        s.todo.append('in [build-system] of pyproject.toml: build-backend = "flytune_build.backend", and add '
                      '"flytune-build" to requires')
    elif backend is None:  # PEP 517: no backend named builds with setuptools' legacy one
        s.todo.append('in [build-system] of pyproject.toml: build-backend = "flytune_build.backend" (none is named: '
                      'setuptools\' legacy backend builds it, and does not bundle), and add "flytune-build" to '
                      'requires')
    elif backend == "hatchling.build":
        s.todo.append('add to pyproject.toml: [tool.hatch.build.hooks.flytune] (the hatchling hook), and '
                      '"flytune-build" to [build-system] requires')
    elif backend != "flytune_build.backend":
        s.todo.append(f"your build backend ({backend}) does not bundle by itself: run `flytune bundle --output "
                      f"{package_dir.relative_to(root).as_posix()}` before each build (docs/guide.md, Build backends)")
    elif "flytune-build" not in " ".join(str(r) for r in system.get("requires", [])).replace("_", "-"):
        s.todo.append('add "flytune-build" to [build-system] requires in pyproject.toml')
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    setuptools_tool = tool.get("setuptools")
    # packages listed, or mapped to directories (`package-dir`: setuptools ships what the mapping names, and
    # a `packages.find` would replace that with what it finds; `"" = "lib"` alone only moves where it looks)
    explicit = (isinstance(setuptools_tool, dict) and any(k in setuptools_tool for k in ("packages", "py-modules"))) \
        or any(name for name in project_mod.setuptools_package_dir(doc))
    flat = package_dir.parents[len(s.package.split(".")) - 1] == root
    if backend in SETUPTOOLS_BACKENDS and flat and not explicit:
        top = s.package.split(".")[0]
        blocks.append(("tool.setuptools.packages.find",
                       f'\n# artifacts/ and tune/ beside the package: tell setuptools which package to ship\n'
                       f'[tool.setuptools.packages.find]\ninclude = ["{top}*"]\n'))
        s.actions.append(f'appended [tool.setuptools.packages.find] include = ["{top}*"]: setuptools ships the '
                         f'package, not artifacts/ or tune/')
    return blocks


def _plan_file(s: Scaffold, force: bool, *, unread: bool) -> None:
    path = s.root / PLAN
    if path.exists() and not force:
        raise InputError("already exists; `flytune init` wrote nothing (--force replaces it)", file=path)
    lines = [f"# The shapes to tune {s.package}'s kernels at, for each target (`flytune tune` runs every entry).",
             f"# Each setup, in {s.package}.{SETUPS}, builds inputs of one shape and returns the call to time.",
             "# Replace the sizes by the ones that matter on the device you ship for."]
    for k in s.kernels:
        shape = ", ".join(f"{toml_text.key(a)} = {DEFAULT_SIZE}" for a in k.axes)
        lines += ["", "[[entries]]", f"kernel = {toml_text.string(k.name)}",
                  f"setup = {toml_text.string(f'{s.package}.{SETUPS}:{k.setup}')}",
                  f"shapes = [{{ {shape} }}]" if shape else "shapes = [{}]"]
        if k.adopted:
            lines.append(f"autotuner = {toml_text.string(f'{k.module}:{k.function}')}  "
                         f"# @triton.autotune: its own search, captured")
    if not s.kernels:
        lines += ["", "# no @flytune_build.autotune or @triton.autotune kernel was found: replace the line below with",
                  "# an entry per kernel:", "#   [[entries]]", f'#   kernel = "{s.package}.add"',
                  f'#   setup = "{s.package}.{SETUPS}:add"', "#   shapes = [{ n = 1024 }]", "entries = []"]
        s.todo.append(f"no kernel found in {s.package}{' (in the modules it could read: see above)' if unread else ''}"
                      f": decorate one with @flytune_build.autotune and add it to {PLAN}")
    text = "\n".join(lines) + "\n"
    try:  # read back as `flytune tune` will read it, before it is written
        project_mod.PLAN.check(project_mod.tomllib.loads(text), "", Fields(path, ProjectError))
    except (ValueError, ProjectError) as e:   # TOMLDecodeError, or an integer beyond Python's digit limit
        raise InputError(f"would not read back as a tuning plan ({e}); `flytune init` wrote nothing: write the "
                         f"plan by hand (docs/reference.md, the tuning plan)", file=path) from None
    s.files[path] = text
    s.actions.append(f"{'replaced' if path.exists() else 'wrote'} {PLAN} ({len(s.kernels)} kernel(s))")


def _python_string(text: str, quotes: str = '"') -> str:
    """`text` as a Python string literal: in `quotes` where it reads as written there, else its repr."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f"{quotes}{text}{quotes}"
    return repr(text)


def _existing_module(package_dir: Path) -> Path | None:
    """What `import <package>.tuning` loads, in the order Python's path finder looks: a package directory,
    an extension module, `tuning.py`, `tuning.pyc`, a namespace directory; None where there is none."""
    directory = package_dir / SETUPS
    if any((directory / f"__init__{suffix}").is_file() for suffix in importlib.machinery.all_suffixes()):
        return directory
    for suffix in (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.SOURCE_SUFFIXES,
                   *importlib.machinery.BYTECODE_SUFFIXES):
        if (package_dir / f"{SETUPS}{suffix}").is_file():
            return package_dir / f"{SETUPS}{suffix}"
    return directory if directory.is_dir() else None


def _setups_module(s: Scaffold, package_dir: Path) -> None:
    path = package_dir / f"{SETUPS}.py"
    rel = path.relative_to(s.root).as_posix()
    existing = _existing_module(package_dir)
    if existing is not None:  # a module of its own that `import` would load instead of one written beside it
        named = existing.relative_to(s.root).as_posix() + ("/" if existing.is_dir() else "")
        s.actions.append(f"kept {named} (it exists): give it the setups {PLAN} names")
        has = top_level_names(existing) if existing.suffix == ".py" else None
        s.todo += [f"add a setup `{k.setup}` to {named}: {PLAN} names {s.package}.{SETUPS}:{k.setup} for {k.name}"
                   for k in s.kernels if has is not None and k.setup not in has]
        return
    if os.path.lexists(path):  # a directory, a FIFO, a dangling link: no module, and no file to write
        raise InputError(f"is not a regular file, and `flytune init` writes the setups module {rel} there: move "
                         f"it aside, then run `flytune init` again; nothing was written", file=path)
    modules = sorted({k.module for k in s.kernels})
    device = _free(DEVICE_HELPER, _imported(s.kernels))
    out = [f'"""Tuning-plan setups ({PLAN}): each builds the inputs of one shape and returns the call to time."""',
           "import os", "", "import torch", "", *(f"import {m}" for m in modules), "", "",
           f"def {device}():",
           '    """Where inputs live: the CPU under TRITON_INTERPRET=1 (Triton\'s interpreter), else the GPU."""',
           '    return "cpu" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "cuda"']
    for k in s.kernels:
        plain = all(IDENTIFIER.fullmatch(a) and not keyword.iskeyword(a) for a in k.axes)
        args = ", ".join(k.axes) if plain else "**shape"  # a key axis no parameter can be named after
        out += ["", "", f"def {k.setup}({args}):",
                f"    {_python_string(f'{k.name} ({k.function}, {k.where(s.root)}) at one shape.', chr(34) * 3)}",
                f"    # x = torch.randn(..., device={device}())",
                f"    # return lambda: <the function of {k.module} that launches {k.function}>(x, ...)",
                f"    raise NotImplementedError("
                f"{_python_string(f'{rel}: {k.setup}() must build inputs and return the call to tune')})"]
    text = "\n".join(out) + "\n"
    _check_module(path, text)
    s.files[path] = text
    s.actions.append(f"wrote {rel} ({len(s.kernels)} setup(s) to fill in)")
    if s.kernels:
        s.todo.insert(0, f"fill in {rel}: each setup builds inputs for one shape and returns the call to time")


def _check_module(path: Path, text: str) -> None:
    """The setups module read back before it is written: Python, binding each top-level name once."""
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as e:
        raise InputError(f"would not be valid Python ({e.msg}, line {e.lineno}); `flytune init` wrote nothing: "
                         f"write the setups by hand", file=path) from None
    imported = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    defined = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    twice = sorted({n for n in defined if defined.count(n) > 1 or n in imported})
    if twice:  # a bug of `init` itself: said, never written
        raise InputError(f"would bind {', '.join(twice)} twice; `flytune init` wrote nothing", file=path)


def _next_steps(s: Scaffold, doc: dict, targets: tuple[str, ...]) -> None:
    """What is left to do by hand, and the commands that come next: a tune on each target's device (the CPU
    for `interpreter`), the build, the check of the wheel."""
    for k in s.kernels:
        if k.adopted and not k.registered:
            s.todo.append(f"{k.where(s.root)}: {k.function} is a @triton.autotune kernel; to serve its tuned configs, "
                          f'call `flytune_build.triton.adopt({k.function}, name="{k.name}")` after it')
    deps = (doc.get("project") or {}).get("dependencies") if isinstance(doc.get("project"), dict) else None
    if not isinstance(doc.get("project"), dict):
        s.todo.append('pyproject.toml has no [project] table: declare the package there (name, version, and '
                      'dependencies = ["flytune-build"]), or add "flytune-build" to the dependencies its setup.cfg '
                      'or setup.py declares: the runtime that serves the configs')
    elif not any(isinstance(d, str) and d.replace("_", "-").lower().startswith("flytune-build") for d in deps or ()):
        s.todo.append('add "flytune-build" to [project] dependencies: the runtime that serves the configs')
    archs = list(dict.fromkeys(t.arch for t in parse_targets(list(targets), Fields(None, InputError), "--target")))
    steps = [("TRITON_INTERPRET=1 flytune tune --ranking synthetic" if arch == "interpreter" else "flytune tune",
              f"tune on {'the CPU' if arch == 'interpreter' else f'a {arch} GPU'}: {OUTPUT.replace('{arch}', arch)}/")
             for arch in archs]
    steps += [("python -m build --wheel", "verifies and bundles the artifacts"),
              ("flytune verify dist/*.whl", "what CI runs on the wheel")]
    s.commands = [f"{command:<53} # {why}" for command, why in steps]
