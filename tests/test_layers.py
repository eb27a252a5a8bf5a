"""The architecture, pinned by reading the imports: four layers, no private name crosses a module,
no import cycle, and the pure layers never import torch, triton or setuptools."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "flytune_build"
HEAVY = {"torch", "triton", "setuptools", "numpy"}
# which of our layers each layer may import (the package root and the public shims are "top")
ALLOWED = {
    "core": {"core"},
    "runtime": {"core", "runtime"},
    "dist": {"core", "dist"},                       # wheel/sdist read and write
    "pipeline": {"core", "dist", "pipeline"},
    "tuning": {"core", "runtime", "tuning"},        # the tuning engine, under every executor
    "audit": {"core", "dist", "pipeline", "runtime", "audit"},  # runtime: --deep only, imported lazily
    "store": {"core", "store"},                     # artifact directories: fmt, merge
    "interop": {"core", "store", "interop"},        # other tools' config formats
    "review": {"core", "audit", "review"},     # `flytune report`: pages
    "cli": {"core", "runtime", "pipeline", "dist", "tuning", "audit", "store", "interop", "review", "cli", "top"},
    "backend": {"pipeline"},
    "build_hook": {"pipeline", "core"},  # the hatchling hook, beside backend: loaded only by hatchling
    "top": {"core", "runtime", "tuning", "audit", "store", "interop", "review"},
}
ENGINES = ("tuning", "audit", "store", "interop", "review", "dist")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or module in ("flytune_build.triton", "flytune_build.flydsl"):
        return "top"
    return parts[1] if parts[1] in ALLOWED else "top"


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def imports(module: str):
    """(imported module, names taken from it, line, at module level) for every import statement."""
    tree = ast.parse(MODULES[module].read_text("utf-8"))
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, (), node.lineno, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = tuple(a.name for a in node.names)
            for n in names:  # `from . import x` imports the module x when there is one
                if f"{target}.{n}" in MODULES:
                    yield f"{target}.{n}", (), node.lineno, id(node) in top_level
            rest = tuple(n for n in names if f"{target}.{n}" not in MODULES)
            if rest or len(rest) == len(names):  # `from .. import pipeline` imports only the module
                yield target, rest, node.lineno, id(node) in top_level


def ours(name: str) -> bool:
    return name == "flytune_build" or name.startswith("flytune_build.")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layer_imports_only_what_it_may(module):
    mine = layer(module)
    for target, _, line, _ in imports(module):
        if ours(target):
            assert layer(target) in ALLOWED[mine], f"{module}:{line} ({mine}) imports {target} ({layer(target)})"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) in ("core", "pipeline", "dist", "store",
                                                                                 "interop", "review")))
def test_core_and_pipeline_never_import_heavy_libraries(module):
    for target, _, line, _ in imports(module):
        assert target.split(".")[0] not in HEAVY, f"{module}:{line} imports {target}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) in ("runtime", "top", "tuning", "audit",
                                                                                 "cli")))
def test_runtime_imports_heavy_libraries_lazily(module):
    for target, _, line, top in imports(module):
        if target.split(".")[0] in HEAVY:
            assert not top, f"{module}:{line} imports {target} at import time"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == "audit" and m != "flytune_build.audit.execution"))
def test_audit_imports_the_runtime_only_lazily(module):
    """verify, inspect and diff run without torch: the runtime is loaded only for --deep (audit.execution,
    itself imported only then)."""
    for target, _, line, top in imports(module):
        if layer(target) == "runtime" and ours(target):
            assert not top, f"{module}:{line} imports {target} at import time"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_ray_only_in_the_executors_and_tqdm_only_in_the_progress_module(module):
    for target, _, line, _ in imports(module):
        if target.split(".")[0] == "ray":
            assert module == "flytune_build.tuning.executors", f"{module}:{line} imports ray"
        if target.split(".")[0] == "tqdm":
            assert module == "flytune_build.cli.progress", f"{module}:{line} imports tqdm"


def test_no_engine_lives_under_the_cli():
    """cli/ parses arguments, prints, and maps outcomes to exit codes; the work is in the engines."""
    for module, path in MODULES.items():
        if layer(module) != "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"subprocess", "selectors", "zipfile", "tarfile", "threading", "ray"} & set(names), \
                    f"{module}:{node.lineno} does an engine's work ({names})"


# where a name `render`/`render_*` may be defined: the CLI, core.table (the table layout), core.errors (an
# error's message, raised by every layer) and review (its product is a page: `review.render`, documented)
RENDERERS = ("flytune_build.cli", "flytune_build.core.table", "flytune_build.core.errors", "flytune_build.review")
# who may lay out a table: the CLI, and the report a build prints (the PEP 517 backend has no CLI)
TABLE_USERS = ("flytune_build.cli", "flytune_build.pipeline.report")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_engines_hold_no_rendering(module):
    """An engine returns data; the text a command prints is made in cli/ (cli.render) from it."""
    mine = module.startswith(RENDERERS)
    for node in ast.walk(ast.parse(MODULES[module].read_text("utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not mine:
            assert node.name != "render" and not node.name.startswith("render_"), \
                f"{module}:{node.lineno} defines {node.name}: text belongs to cli.render"
    if not module.startswith(TABLE_USERS):
        for target, _, line, _ in imports(module):
            assert target != "flytune_build.core.table", f"{module}:{line} lays out a table: that is cli.render's"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_modules(module):
    tree = ast.parse(MODULES[module].read_text("utf-8"))
    aliases = {}
    for target, names, line, _ in imports(module):
        if ours(target):
            for n in names:
                assert not n.startswith("_") or n.startswith("__"), f"{module}:{line} imports {target}.{n}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                and not node.attr.startswith("__") and node.value.id in aliases
                and node.value.id not in ("self", "cls")):
            target = aliases[node.value.id]
            if ours(target) or f"flytune_build.{target}" in MODULES or any(m.endswith("." + target) for m in MODULES):
                raise AssertionError(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
    # an object of another module's class: its private names are that module's (defined here: ours)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
    defined |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.Lambda) for a in n.args.args}
    defined |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and node.attr not in defined):
            raise AssertionError(f"{module}:{node.lineno} uses {ast.unparse(node)}, private to another module")


def test_no_import_cycles():
    graph = {m: {t for t, _, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}
    for m in MODULES:  # a package's __init__ that only re-exports a child is not a cycle through it
        graph[m] = {t for t in graph[m] if not (_is_package(t) and m.startswith(t + "."))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def test_the_tree_shows_the_layers():
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert {"core", "runtime", "pipeline", "cli", "tuning", "audit", "dist", "store"} <= folders
    assert folders <= {"core", "runtime", "pipeline", "cli", *ENGINES}
    assert (PKG / "runtime" / "adapters").is_dir()


def test_no_module_is_too_long():
    """No module over ~520 lines, no class over ~250, no function over ~60: each concern its own module."""
    for module, path in MODULES.items():
        text = path.read_text("utf-8")
        assert text.count("\n") <= 520, f"{module} is {text.count(chr(10))} lines: more than one job?"
        for node in ast.walk(ast.parse(text)):
            size = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef):
                assert size <= 260, f"{module}.{node.name} is {size} lines"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert size <= 65, f"{module}.{node.name} is {size} lines"


def test_verify_of_a_directory_imports_no_runtime():
    """`flytune verify` of a wheel or directory reads installed-bundle rules from core.installed: the
    runtime (and with it torch and triton) is never loaded."""
    import subprocess
    import sys

    artifacts = PKG.parent / "sample_pkg" / "artifacts" / "interpreter"
    code = ("import sys, flytune_build as ft; src = ft.verify(sys.argv[1]); assert not src.errors, src.errors; "
            "loaded = sorted(m for m in sys.modules if m.startswith(('flytune_build.runtime', 'torch', 'triton'))); "
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code, str(artifacts)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_pytorch_private_inductor_hooks_are_reached_from_one_module(module):
    """runtime.inductor.hooks names each private PyTorch hook it uses (HOOKS, pinned by tests/test_inductor.py);
    no other module reaches into torch._inductor or torch._dynamo."""
    if module == "flytune_build.runtime.inductor.hooks":
        return
    for target, _, line, _ in imports(module):
        assert not target.startswith(("torch._inductor", "torch._dynamo")), f"{module}:{line} imports {target}"


def test_every_module_has_tests_in_the_index():
    """tests/INDEX.md maps each module to the test files that test it: every module is there, and
    every file it names exists."""
    import re

    index = (PKG.parent / "tests" / "INDEX.md").read_text("utf-8")
    rows = dict(re.findall(r"^\| `([\w.]+)` \| ([^|]+) \|$", index, re.MULTILINE))
    missing = sorted(set(MODULES) - set(rows))
    assert not missing, f"modules without tests in tests/INDEX.md: {missing}"
    for module, files in rows.items():
        for name in (f.strip() for f in files.split(",")):
            assert (PKG.parent / "tests" / name).is_file(), f"tests/INDEX.md: {module} names {name}, which is no file"
