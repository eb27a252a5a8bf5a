"""An existing package's kernels, found by reading its source: never imported, so `flytune init` runs
where torch and triton are not installed and runs none of the package's code. A kernel is a function
under `@flytune_build.autotune` (however imported) or `@triton.autotune`; its name is the one its
artifacts carry (a literal, or a string constant the module binds once: never a guess), its axes the
scalar ones of its key (the keys of a plan's shape). A module that cannot be read as Python is said,
with why, never passed over in silence."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ..core import fsutil
from ..core.errors import InputError

POINTER_USES = {"load", "store", "make_block_ptr", "make_tensor_descriptor"}  # a parameter used in these is a tensor
MAX_SOURCE_BYTES = 16 << 20  # a module read to find its kernels


@dataclass(frozen=True)
class FoundKernel:
    """A kernel found in the package's source."""

    name: str | None         # the kernel name its artifacts carry; None: not readable from the source
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


def find_kernels(package_dir: Path, package: str,
                 unread: list[tuple[Path, int | None, str]] | None = None) -> list[FoundKernel]:
    """Every `@flytune_build.autotune` and `@triton.autotune` kernel under `package_dir`, in file and line
    order. A module read as Python reads it (bytes: its coding cookie or BOM honoured); one that cannot
    be is left out, and (file, line or None, why) added to `unread`."""
    found, unread = [], ([] if unread is None else unread)
    # a contained, bounded walk of regular files (a FIFO or a link to /dev/zero named *.py is skipped),
    # each read capped: reading the source never hangs
    reached = fsutil.find(package_dir, "**", suffix=".py", error=InputError, file=package_dir, root_name="the package")
    for rel_posix in sorted(reached.files.values()):
        path = package_dir / rel_posix
        rel = Path(rel_posix).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        module = ".".join([package, *parts])
        try:
            tree = ast.parse(fsutil.read_regular(path, InputError, MAX_SOURCE_BYTES), str(path))
        except SyntaxError as e:  # a bad coding cookie or undecodable bytes too
            unread.append((path, e.lineno, f"is not valid Python ({e.msg})"))
            continue
        except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as e:
            unread.append((path, None, f"cannot be read as Python ({type(e).__name__}: {e})"))
            continue
        except InputError as e:  # too large, unreadable
            unread.append((path, None, e.rule))
            continue
        aliases = _aliases(tree)
        constants = _constants(tree)
        adopted = _adopt_names(tree, aliases, constants)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                k = _kernel(node, aliases, module, path, adopted, constants)
                if k is not None:
                    found.append(k)
    return sorted(found, key=lambda k: (str(k.file), k.line))


def _adopt_names(tree: ast.Module, aliases: dict[str, str], constants: dict[str, str]) -> dict[str, str | None]:
    """Function -> name, for each `flytune_build.triton.adopt(function, name=...)` of the module (None:
    a name the source does not spell out)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func, aliases) == "flytune_build.triton.adopt" and node.args \
                and isinstance(node.args[0], ast.Name):
            named = [kw.value for kw in node.keywords if kw.arg == "name"] + node.args[1:2]
            if named:
                out[node.args[0].id] = _string(named[0], constants)
    return out


def _constants(tree: ast.Module) -> dict[str, str]:
    """Name -> value, for each name the module binds exactly once, at its top level, to a string literal
    (`NAME = "mylib.mul"`): a name the module binds anywhere else as well (a second assignment, an import,
    a loop, a `def`, a function's `global`) is no constant the source alone can vouch for."""
    bound = [n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names]
    scope = list(tree.body)
    while scope:  # the module's own scope: not the bodies of its functions and classes
        node = scope.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.append(node.name)
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.append(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound += [a.asname or a.name.split(".")[0] for a in node.names]
        scope.extend(ast.iter_child_nodes(node))
    out = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and bound.count(target.id) == 1 and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            out[target.id] = node.value.value
    return out


def _string(node: ast.AST, constants: dict[str, str]) -> str | None:
    """A string literal's value, or that of a module constant it names (`_constants`); else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return constants.get(node.id) if isinstance(node, ast.Name) else None


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


def _kernel(node, aliases: dict[str, str], module: str, path: Path, adopted: dict[str, str | None],
            constants: dict[str, str]) -> FoundKernel | None:
    for dec in node.decorator_list:
        kind = _decorator_kind(dec, aliases)
        if kind in ("flytune", "triton") and isinstance(dec, ast.Call):
            # flytune's default name (`name=None` too); an adopted kernel has none until `adopt` names it: the
            # package's name and the function's, as a library would spell it
            name = f"{module}.{node.name}" if kind == "flytune" else adopted[node.name] if node.name in adopted \
                else f"{module.split('.')[0]}.{node.name.removesuffix('_kernel') or node.name}"
            for kw in dec.keywords:
                if kw.arg == "name" and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                    name = _string(kw.value, constants)
            return FoundKernel(name, node.name, module, path, node.lineno, kind == "triton", node.name in adopted,
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
    return tuple(dict.fromkeys(n for n in names if n not in pointers))  # an axis named twice is one parameter


def top_level_names(path: Path) -> set[str] | None:
    """The names a module binds at its top level, in `if`/`try`/`with` too (None: it cannot be read as
    Python, or `import *` binds names no reading can tell)."""
    try:
        tree = ast.parse(fsutil.read_regular(path, InputError, MAX_SOURCE_BYTES), str(path))
    except (SyntaxError, ValueError, InputError):
        return None
    names, todo = set(), list(tree.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.If, ast.Try, ast.With)):
            todo += [*n.body, *getattr(n, "orelse", ()), *getattr(n, "finalbody", ()),
                     *(b for h in getattr(n, "handlers", ()) for b in h.body)]
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in n.names):
                return None
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    return names
