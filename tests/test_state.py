"""The state model (docs/architecture.md, "State"): what belongs to the process, to one context, to a
forked child. Tuning runs in threads stay apart, a serving thread is outside every tuning run, and every
module-level mutable global is named in the architecture's state table."""
import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from buildkit import tune_pyproject
from conftest import python_env

ROOT = Path(__file__).resolve().parent.parent

KERNELS = '''
import time
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

CALLED = []   # (reference, n): every call of this package's reference function

@ft.autotune([Config({"BLOCK": b}) for b in (16, 32, 64)], ["n"], name="{name}.op")
@triton.jit
def op_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) {op} tl.load(y + offs, mask=m), mask=m)

def launch(x, y, out, n):
    op_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)

def op(n):
    g = torch.Generator().manual_seed(n)
    x, y, out = torch.rand(n, generator=g) + 1, torch.rand(n, generator=g) + 1, torch.empty(n)
    return lambda: launch(x, y, out, n)

def reference(x, y, out, n):
    CALLED.append(("{name}", n))
    time.sleep(0.005)   # the other run's thread goes on meanwhile
    out.copy_(x {op} y)
'''

TWO_RUNS = '''
import json, sys, threading
from pathlib import Path
import flytune_build as ft
from flytune_build.core import settings
from flytune_build.runtime.searching import session

from triton.runtime import interpreter

# Triton's interpreter keeps a launch's grid in process globals: two threads' launches are serialised
# here (a GPU needs no such lock; flytune's own state is what this test is about)
_launching, _call = threading.RLock(), interpreter.GridExecutor.__call__
def _serialised(self, *args, **kwargs):
    with _launching:
        return _call(self, *args, **kwargs)
interpreter.GridExecutor.__call__ = _serialised

base, got, errors = Path(sys.argv[1]), {}, []
stdout, path, before = sys.stdout, list(sys.path), settings.current()
SHAPES = [100, 200, 300, 400, 500, 600]

def tune(name):
    try:
        got[name] = ft.tune(base / name, ranking="synthetic", resume=False)
    except BaseException as e:
        errors.append(repr(e))

threads = [threading.Thread(target=tune, args=(n,)) for n in ("apkg", "bpkg")]
for t in threads:
    t.start()
sys.path.insert(0, str(base / "apkg"))
import apkg.kernels as served   # the main thread serves apkg's kernel meanwhile, with FLYTUNE_AUTOTUNE=0
import torch
decided = []
ft.on_decision(lambda e: decided.append((threading.current_thread().name, e["kernel"], e["key"].get("n"), e["tier"])))
modes, n = set(), 1000
while any(t.is_alive() for t in threads):
    modes.add((settings.current().autotune, session.current() is session.OUTSIDE))
    x = torch.ones(n)
    served.launch(x, x, torch.empty(n), n)
    n += 1
for t in threads:
    t.join()
sys.path.remove(str(base / "apkg"))
out = {"errors": errors, "stdout_restored": sys.stdout is stdout, "path_restored": sys.path == path,
       "settings_restored": settings.current() == before, "main_modes": sorted(modes), "main_calls": n - 1000}
for name, report in got.items():
    files = sorted((base / name / "artifacts" / "interpreter").glob("*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    out[name] = {"ok": report.ok, "changes": report.changes(), "shapes": sorted(d["key"]["n"] for d in docs),
                 "checked_by": sorted({d["provenance"]["outputs"].get("function") for d in docs}),
                 "rejected": sum(d["provenance"]["outputs"].get("rejected", 0) for d in docs),
                 "called": sorted({c for c, _ in sys.modules[f"{name}.kernels"].CALLED})}
out["main_decisions"] = sorted({tier for who, kernel, key_n, tier in decided if who == "MainThread"})
out["searched_main_keys"] = sorted({key_n for who, kernel, key_n, tier in decided if tier == "search" and key_n >= 1000})
print(json.dumps(out))
'''


def _project(root: Path, name: str, op: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "kernels.py").write_text(KERNELS.replace("{name}", name).replace("{op}", op))
    shapes = ", ".join(f"{{ n = {n} }}" for n in (100, 200, 300, 400, 500, 600))
    (root / "pyproject.toml").write_text(tune_pyproject(name, (
        f'entries = [{{ kernel = "{name}.op", setup = "{name}.kernels:op", '
        f'reference = "{name}.kernels:reference", shapes = [{shapes}] }}]')))


def test_two_tuning_runs_in_two_threads_stay_apart_and_a_serving_thread_is_outside_both(tmp_path):
    """Two `tune()` calls on two projects in two threads, while the main thread serves with
    FLYTUNE_AUTOTUNE=0: each run checks its candidates against its own reference, ships its 6 winners,
    none rejected; the main thread never searches nor writes into a run's output; stdout, sys.path and
    the settings are as they were."""
    _project(tmp_path / "apkg", "apkg", "+")
    _project(tmp_path / "bpkg", "bpkg", "*")
    script = tmp_path / "two_runs.py"
    script.write_text(TWO_RUNS)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache")
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["errors"] == []
    for name in ("apkg", "bpkg"):
        run = got[name]
        assert run["ok"] and run["changes"] == {"new": 6, "kept": 0, "replaced": 0}, run
        assert run["shapes"] == [100, 200, 300, 400, 500, 600], run
        assert run["checked_by"] == [f"{name}.kernels:reference"] and run["rejected"] == 0, run
        assert run["called"] == [name], run
    assert got["main_calls"] > 0 and got["main_modes"] == [["off", True]], got
    assert got["main_decisions"] == ["first"] or set(got["main_decisions"]) <= {"first", "heuristic"}, got
    assert got["searched_main_keys"] == [], got
    assert got["stdout_restored"] and got["path_restored"] and got["settings_restored"], got


MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
            "discard", "appendleft", "sort"}
HOLDERS = {"ContextVar", "Lock", "RLock", "local", "Event", "Condition", "WeakKeyDictionary", "WeakValueDictionary"}


def _module_state(path: Path) -> set[str]:
    """The module-level names of `path` that hold state: rebound by a `global` statement, mutated from a
    function (a mutating method, an item or attribute assigned), holding a lock, context variable or weak
    map, an instance of a flytune class that is not a frozen dataclass, or a function's cache."""
    tree = ast.parse(path.read_text())
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Name):
                    top[t.id] = node.value
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= {n for n in node.names if n in top}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node in tree.body and any("cache" in ast.unparse(d) for d in node.decorator_list):
                found.add(node.name)
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and \
                        isinstance(inner.func.value, ast.Name) and inner.func.value.id in top and \
                        inner.func.attr in MUTATORS:
                    found.add(inner.func.value.id)
                targets = inner.targets if isinstance(inner, (ast.Assign, ast.Delete)) else \
                    [inner.target] if isinstance(inner, ast.AugAssign) else []
                for t in targets:
                    if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name) and \
                            t.value.id in top:
                        found.add(t.value.id)
    for name, value in top.items():
        if isinstance(value, ast.Call):
            f = value.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called in HOLDERS or (called.lstrip("_")[:1].isupper() and called in _mutable_classes(tree)):
                found.add(name)
    return found


def _mutable_classes(tree) -> set[str]:
    """The classes a module defines that are not frozen dataclasses."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            frozen = any("frozen=True" in ast.unparse(d) for d in node.decorator_list)
            if not frozen and not any(ast.unparse(b) in ("Exception", "Enum", "NamedTuple") or
                                      ast.unparse(b).endswith("Error") for b in node.bases):
                out.add(node.name)
    return out


def _state_table() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## State\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z_.]+\.[A-Za-z_]+)`", section, re.MULTILINE)}


def test_every_module_level_mutable_global_is_in_the_state_table():
    """docs/architecture.md's state table names every module-level global that holds state, and nothing
    that is gone: a new global is a decision written down (per process, per context, what a fork gets)."""
    found = set()
    for path in sorted((ROOT / "flytune_build").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "flytune_build").with_suffix("").parts)
        found |= {f"{module}.{name}" for name in _module_state(path)}
    table = _state_table()
    assert not found - table, f"module-level state the table does not name: {sorted(found - table)}"
    assert not table - found, f"the table names state that is gone: {sorted(table - found)}"


SERVE_KERNEL = '''

@ft.autotune([Config({"BLOCK": b}) for b in (16, 32)], ["n"], name="{name}.serve")
@triton.jit
def serve_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2, mask=m)

def serve(n, times=1):
    x, out = torch.ones(n), torch.empty(n)
    for _ in range(times):
        serve_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    assert bool((out == 2).all())
'''

STRESS = '''
import json, os, sys, threading, time
from pathlib import Path
from triton.runtime import interpreter

_launching, _call = threading.RLock(), interpreter.GridExecutor.__call__
def _serialised(self, *args, **kwargs):   # Triton's interpreter keeps a launch's grid in process globals
    with _launching:
        return _call(self, *args, **kwargs)
interpreter.GridExecutor.__call__ = _serialised

import torch
import flytune_build as ft
import torch._inductor.config as inductor_config
import flytune_build.inductor

base, started = Path(sys.argv[1]), time.monotonic()
sys.path.insert(0, str(base / "apkg"))
import apkg.kernels as k

# a pre-fork server: the parent serves, then forks two workers that serve and exit
k.serve(10, 3)
children = []
for w in range(2):
    pid = os.fork()
    if pid == 0:
        k.serve(10, 2)
        k.serve(20 + w, 1)
        sys.exit(0)
    children.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]

# then threads: two tuning runs, three serving threads, two threads entering serve() again and again
user_table = {"user-key": {"XBLOCK": 8, "num_warps": 1, "num_stages": 1}}
inductor_config.autotune_lookup_table = user_table
errors, reports = [], {}
k.serve(30)   # decided once, before the threads
def run(target, *args):
    try:
        target(*args)
    except BaseException as e:
        errors.append(f"{target.__name__}: {e!r}")
def tune(name):
    reports[name] = ft.tune(base / name, ranking="synthetic", resume=False)
def served():
    k.serve(30, 50)
def serving():
    for _ in range(300):
        with ft.inductor.serve() as s:
            with s:
                pass
threads = [threading.Thread(target=run, args=(tune, "apkg")), threading.Thread(target=run, args=(tune, "bpkg"))]
threads += [threading.Thread(target=run, args=(served,)) for _ in range(3)]
threads += [threading.Thread(target=run, args=(serving,)) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"errors": errors, "children": codes, "changes": {n: r.changes() for n, r in reports.items()},
                  "ok": {n: r.ok for n, r in reports.items()},
                  "table_restored": inductor_config.autotune_lookup_table == user_table,
                  "seconds": time.monotonic() - started}))
'''


def test_stress_threads_tuning_runs_serving_and_forked_workers_keep_exact_counts(tmp_path):
    """A serving process under load, as one test: a parent serves and forks two workers that serve and
    exit; then two tuning runs, three serving threads and two threads entering `serve()` 300 times each
    (re-entered) run at once, all writing one FLYTUNE_MISSES file. The runs ship their winners, the
    lookup table is the user's again, and the misses file counts every serving call exactly once, no
    decision twice, and nothing of the tuning runs."""
    _project(tmp_path / "apkg", "apkg", "+")
    _project(tmp_path / "bpkg", "bpkg", "*")
    kernels = tmp_path / "apkg" / "apkg" / "kernels.py"
    kernels.write_text(kernels.read_text() + SERVE_KERNEL.replace("{name}", "apkg"))
    script = tmp_path / "stress.py"
    script.write_text(STRESS)
    misses = tmp_path / "misses.json"
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache",
                     FLYTUNE_MISSES=misses)
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["errors"] == [] and got["children"] == [0, 0], got
    assert got["changes"] == {n: {"new": 6, "kept": 0, "replaced": 0} for n in ("apkg", "bpkg")}, got
    assert got["ok"] == {"apkg": True, "bpkg": True} and got["table_restored"], got
    doc = json.loads(misses.read_text())
    rows = {(m["kernel"], m["key"]["n"]): (m["calls"], m["decisions"]) for m in doc["misses"]}
    assert rows == {("apkg.serve", 10): (3 + 2 * 2, 1), ("apkg.serve", 20): (1, 1), ("apkg.serve", 21): (1, 1),
                    ("apkg.serve", 30): (1 + 3 * 50, 1)}, rows
    assert doc.get("dropped", 0) == 0
