"""`flytune init`: an existing package's `[tool.flytune]`, tuning plan and setups, from its source.

The package is read, never imported: its kernels are found by their decorators in the syntax tree
(`@flytune_build.autotune`, however imported, and `@triton.autotune`), so `init` runs where torch and
triton are not installed and runs none of the package's code. Invariants: everything is checked
before anything is written (a refusal writes nothing); an existing `[tool.flytune]` or plan file is
replaced only with `force`, and the setups module never; pyproject.toml is only appended to, so
what was there stays byte for byte (but for a replaced `[tool.flytune]`, with `force`).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core import fsutil
from ..core import project as project_mod
from ..core.codec import Fields
from ..core.errors import InputError, ProjectError
from ..core.fsutil import atomic_write
from ..core.target import parse_targets

PLAN = "tune/plan.toml"
OUTPUT = "artifacts/{arch}"
SOURCES = "artifacts"
SETUPS = "tuning"  # the module of setups, inside the package
# setuptools backends find packages on their own, and a flat layout with artifacts/ and tune/ beside
# the package is "several top-level packages" to them: the one layout that needs `packages.find`
SETUPTOOLS_BACKENDS = (None, "setuptools.build_meta", "setuptools.build_meta:__legacy__", "flytune_build.backend")
POINTER_USES = {"load", "store", "make_block_ptr", "make_tensor_descriptor"}  # a parameter used in these is a tensor
DEFAULT_SIZE = 1024
HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


@dataclass(frozen=True)
class FoundKernel:
    """A kernel found in the package's source."""

    name: str                # the kernel name its artifacts carry
    function: str            # the decorated function
    module: str              # its dotted module
    file: Path
    line: int
    adopted: bool            # a `@triton.autotune` kernel, served once `flytune_build.triton.adopt` names it
    registered: bool         # adopted: an `adopt` call of its module names it already
    axes: tuple[str, ...]    # the key's scalar axes: the keys of a plan shape
    setup: str = ""          # the setup function's name in the setups module

    def where(self, root: Path) -> str:
        return f"{self.file.relative_to(root).as_posix()}:{self.line}"


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


def scaffold(root: str | Path = ".", *, package: str | None = None, targets: tuple[str, ...] = ("interpreter",),
             force: bool = False) -> Scaffold:
    """What `init` writes for the project at `root`: checks everything, writes nothing. An InputError
    (a ProjectError for pyproject.toml itself) names what is in the way and what to do."""
    root = Path(root).resolve()
    parse_targets(list(targets), Fields(None, InputError), "--target")  # the rule [tool.flytune] targets follow
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise InputError("has no pyproject.toml: `flytune init` configures an existing package; write its "
                         "[project] table first (or pass --project DIR)", file=root)
    doc = project_mod.read_toml(pyproject)  # capped, UTF-8 and TOML checked: the text below is read once more
    text = pyproject.read_bytes().decode("utf-8")  # not read_text: its newline translation would rewrite CRLF
    tool = doc.get("tool") if isinstance(doc.get("tool"), dict) else {}
    if package is None:
        try:
            package = project_mod.infer_package(root, Fields(pyproject, ProjectError, project_mod.ROOT))
        except ProjectError as e:
            found = e.rule.removeprefix("is required: cannot infer it ")
            raise InputError(f"cannot tell which package to configure {found}: pass --package NAME",
                             file=root) from None
        field_hint = ""
    else:
        field_hint = " (--package)"
        if not isinstance(package, str) or not PACKAGE_NAME.fullmatch(package):
            raise InputError(f"--package must be a dotted Python package name (mylib, or mylib.ops), not "
                             f"{package!r}", file=root, field="--package")
    package_dir = _package_dir(root, doc, package)
    if package_dir is None:
        raise InputError(f"package {package!r}{field_hint} is not under the project root or src/: no "
                         f"{package.replace('.', '/')}/__init__.py", file=root)

    s = Scaffold(root, package, find_kernels(package_dir, package))
    _name_setups(s.kernels)
    text = _tool_flytune(s, pyproject, text, tool, targets, force)
    text = _packaging(s, root, doc, package_dir, text)
    s.files[pyproject] = text
    _plan_file(s, force)
    _setups_module(s, package_dir)
    _next_steps(s, doc)
    return s


def write(s: Scaffold) -> None:
    """Write what `scaffold` planned, each file atomically, each inside the project: a file that is a
    symlink, or a path through one that leaves the project, is refused before anything is written."""
    root = s.root.resolve()
    for path in s.files:
        if path.is_symlink() or not path.resolve().is_relative_to(root):
            raise InputError("is a symlink, or reached through one that leaves the project: `flytune init` "
                             "wrote nothing (write it by hand, or replace the link with a file)", file=path)
    for path, text in s.files.items():
        atomic_write(path, text.encode("utf-8"))


MAX_SOURCE_BYTES = 16 << 20  # a module read to find its kernels
PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def find_kernels(package_dir: Path, package: str) -> list[FoundKernel]:
    """Every `@flytune_build.autotune` and `@triton.autotune` kernel under `package_dir`, in file and line
    order. A file that does not parse is skipped: the build or the import names its error."""
    found = []
    # a contained, bounded walk of regular files (a FIFO or a link to /dev/zero named *.py is skipped),
    # each read capped: reading the source never hangs
    reached = fsutil.find(package_dir, "**", suffix=".py", error=InputError, file=package_dir, root_name="the package")
    for rel_posix in sorted(reached.files.values()):
        path = package_dir / rel_posix
        rel = Path(rel_posix).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        module = ".".join([package, *parts])
        try:
            tree = ast.parse(fsutil.read_regular(path, InputError, MAX_SOURCE_BYTES).decode("utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError, InputError):
            continue
        aliases = _aliases(tree)
        adopted = _adopt_names(tree, aliases)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                k = _kernel(node, aliases, module, path, adopted.get(node.name))
                if k is not None:
                    found.append(k)
    return sorted(found, key=lambda k: (str(k.file), k.line))


def _adopt_names(tree: ast.Module, aliases: dict[str, str]) -> dict[str, str]:
    """Function -> name, for each `flytune_build.triton.adopt(function, name="...")` of the module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func, aliases) == "flytune_build.triton.adopt" and node.args \
                and isinstance(node.args[0], ast.Name):
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    out[node.args[0].id] = kw.value.value
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                out[node.args[0].id] = node.args[1].value
    return out


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (`ft` -> `flytune_build`)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _decorator_kind(dec: ast.AST, aliases: dict[str, str]) -> str:
    """"flytune", "triton" (an autotune of either), "jit" (`triton.jit`) or ""."""
    name = _dotted(dec.func if isinstance(dec, ast.Call) else dec, aliases)
    if name.startswith("flytune_build.") and name.endswith(".autotune"):
        return "flytune"
    if name in ("triton.autotune", "triton.runtime.autotune", "triton.runtime.autotuner.autotune"):
        return "triton"
    if name in ("triton.jit", "triton.runtime.jit"):
        return "jit"
    return ""


def _kernel(node, aliases: dict[str, str], module: str, path: Path, adopted_as: str | None) -> FoundKernel | None:
    for dec in node.decorator_list:
        kind = _decorator_kind(dec, aliases)
        if kind in ("flytune", "triton") and isinstance(dec, ast.Call):
            # flytune's default name; an adopted kernel has none until `adopt` names it: the package's name
            # and the function's, as a library would spell it
            name = f"{module}.{node.name}" if kind == "flytune" else \
                adopted_as or f"{module.split('.')[0]}.{node.name.removesuffix('_kernel') or node.name}"
            for kw in dec.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    name = kw.value.value
            return FoundKernel(name, node.name, module, path, node.lineno, kind == "triton", adopted_as is not None,
                               _axes(dec, node))
    return None


def _axes(dec: ast.Call, fn) -> tuple[str, ...]:
    """The key's axes that are not tensors: a key entry that is a string or the first argument of a
    call (`pow2("M")`), less the parameters the kernel loads from or stores to."""
    key = next((kw.value for kw in dec.keywords if kw.arg == "key"), dec.args[1] if len(dec.args) > 1 else None)
    names = []
    for item in key.elts if isinstance(key, (ast.List, ast.Tuple)) else ():
        if isinstance(item, ast.Call) and item.args:
            item = item.args[0]
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            names.append(item.value)
    pointers = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and (node.func.attr in POINTER_USES or node.func.attr.startswith("atomic_")):
            pointers |= {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
    return tuple(n for n in names if n not in pointers)


def _name_setups(kernels: list[FoundKernel]) -> None:
    """Each kernel's setup function: its function's name less a `_kernel` suffix, made unique."""
    taken: set[str] = set()
    for i, k in enumerate(kernels):
        base = k.function.removesuffix("_kernel") or k.function
        name = base if base not in taken else f"{k.module.rsplit('.', 1)[-1]}_{base}"
        while name in taken:
            name += "_"
        taken.add(name)
        kernels[i] = FoundKernel(k.name, k.function, k.module, k.file, k.line, k.adopted, k.registered, k.axes, name)


def _package_dir(root: Path, doc: dict, package: str) -> Path | None:
    top = package.split(".")[0]
    rest = package.split(".")[1:]
    for base in project_mod.package_bases(root, doc, top):
        d = Path(base, *rest)
        if (d / "__init__.py").is_file():
            return d
    return None


def _tables(text: str) -> list[tuple[int, str]]:
    """(line index, dotted table name) of every table header, as written."""
    return [(i, re.sub(r"\s*\.\s*", ".", m.group(1)).replace('"', ""))
            for i, line in enumerate(text.splitlines()) if (m := HEADER.match(line))]


def _ours(name: str) -> bool:
    return name == "tool.flytune" or name.startswith("tool.flytune.")


def _tool_flytune(s: Scaffold, pyproject: Path, text: str, tool: dict, targets: tuple[str, ...], force: bool) -> str:
    if "flytune" in tool:
        if not force:
            raise ProjectError("already has a [tool.flytune] table; `flytune init` wrote nothing (--force replaces "
                               "it, and the plan file)", file=pyproject)
        lines = text.splitlines(keepends=True)
        headers = _tables(text)
        spans = [(i, headers[n + 1][0] if n + 1 < len(headers) else len(lines))
                 for n, (i, name) in enumerate(headers) if _ours(name)]
        kept = [line for i, line in enumerate(lines) if not any(a <= i < b for a, b in spans)]
        # the cut must remove [tool.flytune] and nothing else (a header-like line inside a multi-line
        # string is no header): the rest parses to exactly what it was
        before = {**project_mod.tomllib.loads(text)}
        before["tool"] = {k: v for k, v in before.get("tool", {}).items() if k != "flytune"}
        before = {k: v for k, v in before.items() if k != "tool" or v}
        try:
            after = project_mod.tomllib.loads("".join(kept))
        except project_mod.tomllib.TOMLDecodeError:
            after = None
        if not spans or after != before:
            raise ProjectError("holds [tool.flytune] as dotted keys, an inline table or beside a header-like line "
                               "inside a string, which `flytune init --force` cannot replace; remove it by hand "
                               "and run `flytune init` again", file=pyproject)
        text = "".join(kept)
        s.actions.append(f"replaced [tool.flytune] in {pyproject.name} (--force)")
    else:
        s.actions.append(f"appended [tool.flytune] to {pyproject.name}")
    target_list = ", ".join(f'"{t}"' for t in targets)
    block = (f'\n[tool.flytune]\npackage = "{s.package}"\nsources = ["{SOURCES}"]\n'
             f'# one per device you ship for; a GPU: {{ arch = "sm_90", name = "NVIDIA H200", units = 132 }}\n'
             f'targets = [{target_list}]\n\n'
             f'[tool.flytune.tune]\nplan = "{PLAN}"\noutput = "{OUTPUT}"\n')
    return _append(text, block)


def _append(text: str, block: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def _packaging(s: Scaffold, root: Path, doc: dict, package_dir: Path, text: str) -> str:
    system = doc.get("build-system") if isinstance(doc.get("build-system"), dict) else None
    backend = system.get("build-backend") if system else None
    if system is None:
        text = _append(text, '\n[build-system]\nrequires = ["setuptools>=70", "flytune-build"]\n'
                             'build-backend = "flytune_build.backend"\n')
        s.actions.append("appended [build-system]: setuptools with flytune_build.backend")
        backend = "flytune_build.backend"
    elif backend in ("setuptools.build_meta", "setuptools.build_meta:__legacy__"):
        s.todo.append('in [build-system] of pyproject.toml: build-backend = "flytune_build.backend", and add '
                      '"flytune-build" to requires')
    elif backend == "hatchling.build":
        s.todo.append('add to pyproject.toml: [tool.hatch.build.hooks.flytune] (the hatchling hook), and '
                      '"flytune-build" to [build-system] requires')
    elif backend != "flytune_build.backend":
        s.todo.append(f"your build backend ({backend}) does not bundle by itself: run `flytune bundle --output "
                      f"{package_dir.relative_to(root).as_posix()}` before each build (docs/guide.md, Build backends)")
    elif "flytune-build" not in " ".join(str(r) for r in system.get("requires", [])).replace("_", "-"):
        s.todo.append('add "flytune-build" to [build-system] requires in pyproject.toml')
    setuptools_tool = (doc.get("tool") or {}).get("setuptools")
    explicit = isinstance(setuptools_tool, dict) and any(k in setuptools_tool for k in ("packages", "py-modules"))
    flat = package_dir.parents[len(s.package.split(".")) - 1] == root
    if backend in SETUPTOOLS_BACKENDS and flat and not explicit:
        top = s.package.split(".")[0]
        text = _append(text, f'\n# artifacts/ and tune/ beside the package: tell setuptools which package to ship\n'
                             f'[tool.setuptools.packages.find]\ninclude = ["{top}*"]\n')
        s.actions.append(f'appended [tool.setuptools.packages.find] include = ["{top}*"]: setuptools ships the '
                         f'package, not artifacts/ or tune/')
    return text


def _plan_file(s: Scaffold, force: bool) -> None:
    path = s.root / PLAN
    if path.exists() and not force:
        raise InputError("already exists; `flytune init` wrote nothing (--force replaces it)", file=path)
    lines = [f"# The shapes to tune {s.package}'s kernels at, for each target (`flytune tune` runs every entry).",
             f"# Each setup, in {s.package}.{SETUPS}, builds inputs of one shape and returns the call to time.",
             "# Replace the sizes by the ones that matter on the device you ship for."]
    for k in s.kernels:
        shape = ", ".join(f"{a} = {DEFAULT_SIZE}" for a in k.axes)
        lines += ["", "[[entries]]", f'kernel = "{k.name}"', f'setup = "{s.package}.{SETUPS}:{k.setup}"',
                  f"shapes = [{{ {shape} }}]" if shape else "shapes = [{}]"]
        if k.adopted:
            lines.append(f'autotuner = "{k.module}:{k.function}"  # @triton.autotune: its own search, captured')
    if not s.kernels:
        lines += ["", "# no @flytune_build.autotune or @triton.autotune kernel was found: add [[entries]] here"]
        s.todo.append(f"no kernel found in {s.package}: decorate one with @flytune_build.autotune and add it to "
                      f"{PLAN}")
    s.files[path] = "\n".join(lines) + "\n"
    s.actions.append(f"{'replaced' if path.exists() else 'wrote'} {PLAN} ({len(s.kernels)} kernel(s))")


def _setups_module(s: Scaffold, package_dir: Path) -> None:
    path = package_dir / f"{SETUPS}.py"
    rel = path.relative_to(s.root).as_posix()
    if path.exists():
        s.actions.append(f"kept {rel} (it exists): give it the setups {PLAN} names")
        return
    modules = sorted({k.module for k in s.kernels})
    out = [f'"""Tuning-plan setups ({PLAN}): each builds the inputs of one shape and returns the call to time."""',
           "import os", "", "import torch", "", *(f"import {m}" for m in modules), "", "",
           "def device():",
           '    """Where inputs live: the CPU under TRITON_INTERPRET=1 (Triton\'s interpreter), else the GPU."""',
           '    return "cpu" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "cuda"']
    for k in s.kernels:
        args = ", ".join(k.axes)
        out += ["", "", f"def {k.setup}({args}):",
                f'    """{k.name} ({k.function}, {k.where(s.root)}) at one shape."""',
                "    # x = torch.randn(..., device=device())",
                f"    # return lambda: <the function of {k.module} that launches {k.function}>(x, ...)",
                f'    raise NotImplementedError("{rel}: {k.setup}() must build inputs and return the call to tune")']
    s.files[path] = "\n".join(out) + "\n"
    s.actions.append(f"wrote {rel} ({len(s.kernels)} setup(s) to fill in)")
    if s.kernels:
        s.todo.insert(0, f"fill in {rel}: each setup builds inputs for one shape and returns the call to time")


def _next_steps(s: Scaffold, doc: dict) -> None:
    for k in s.kernels:
        if k.adopted and not k.registered:
            s.todo.append(f"{k.where(s.root)}: {k.function} is a @triton.autotune kernel; to serve its tuned configs, "
                          f'call `flytune_build.triton.adopt({k.function}, name="{k.name}")` after it')
    deps = (doc.get("project") or {}).get("dependencies") if isinstance(doc.get("project"), dict) else None
    if not any(isinstance(d, str) and d.replace("_", "-").lower().startswith("flytune-build") for d in deps or ()):
        s.todo.append('add "flytune-build" to [project] dependencies: the runtime that serves the configs')
    s.commands = ["TRITON_INTERPRET=1 flytune tune --ranking synthetic   # tune on the CPU: artifacts/interpreter/",
                  "python -m build --wheel                              # verifies and bundles the artifacts",
                  "flytune verify dist/*.whl                            # what CI runs on the wheel"]
