import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# CI never picks winners: search is off unless a test opts in. Kernels run on the interpreter.
os.environ["FLYTUNE_AUTOTUNE"] = "0"
os.environ["TRITON_INTERPRET"] = "1"
os.environ.pop("FLYTUNE_DEVICE", None)
os.environ.pop("FLYTUNE_ARTIFACT_DIR", None)
os.environ.pop("FLYTUNE_EMIT_DIR", None)


class _Env:
    """`monkeypatch`, re-reading flytune's settings after each change to the environment (the
    runtime reads the environment once, as a process does)."""

    def __init__(self, mp):
        self._mp = mp

    def __getattr__(self, name):
        return getattr(self._mp, name)

    def setenv(self, *args, **kwargs):
        self._mp.setenv(*args, **kwargs)
        _reload()

    def delenv(self, *args, **kwargs):
        self._mp.delenv(*args, **kwargs)
        _reload()


def _reload():
    from flytune_build.core import settings

    settings.reload()


@pytest.fixture
def monkeypatch(monkeypatch):
    yield _Env(monkeypatch)
    monkeypatch.undo()
    _reload()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "scratch-cache"))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    monkeypatch.delenv("FLYTUNE_RANKING", raising=False)
    from flytune_build.runtime.serving import autotuner

    autotuner.reset_stats()
    yield
    autotuner.reset_stats()


def python_env(**extra):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def flytune(*args, cwd=None, **env):
    """`flytune ARGS` in a child process that imports this checkout's flytune_build; env: variables added."""
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", *map(str, args)], capture_output=True,
                          text=True, env=python_env(**env), cwd=cwd)


def counting_bench():
    """A do_bench that runs each candidate once and times it by call order: the first timed is the fastest.
    Returns (do_bench, seen), one entry in seen a call."""
    seen = []

    def do_bench(fn, quantiles=None):
        fn()
        seen.append(1)
        return [float(len(seen))] * 3
    return do_bench, seen


def shared_dir(tmp_path_factory) -> Path:
    """A directory every process of the run shares: pytest-xdist's workers each have a base temp
    directory of their own, under one they share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def flytune_wheel(tmp_path_factory):
    """flytune-build itself as a wheel, built once per run for the tests that install it: by the first
    worker to need it, under a lock (the build is in-tree, in ROOT/build/: two at once would race)."""
    from filelock import FileLock

    out = shared_dir(tmp_path_factory) / "flytune-wheel"
    with FileLock(str(out) + ".lock"):
        if not list(out.glob("flytune_build-*.whl")):
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                                str(ROOT), "-w", str(out)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
    (whl,) = out.glob("flytune_build-*.whl")
    return whl


@pytest.fixture
def third_write_fails(monkeypatch):
    """`fsutil.atomic_write` fails at its third call, as on a full disk (an OutputError naming the file);
    the list of the paths it was called with."""
    from flytune_build.core import fsutil
    from flytune_build.core.errors import OutputError

    real, calls = fsutil.atomic_write, []

    def third_fails(target, data, mode=0o644):
        calls.append(target)
        if len(calls) == 3:
            raise OutputError("cannot be written: No space left on device", file=target)
        real(target, data, mode)
    monkeypatch.setattr(fsutil, "atomic_write", third_fails)
    return calls


@pytest.fixture
def serialised_launches(monkeypatch):
    """Triton's interpreter keeps a launch's grid in process globals: launches on two threads are
    serialised (a GPU needs no such lock; flytune's own state is what threaded tests are about). A test
    module takes it with `pytestmark = pytest.mark.usefixtures("serialised_launches")`."""
    import threading

    from triton.runtime import interpreter

    lock, call = threading.RLock(), interpreter.GridExecutor.__call__

    def serialised(self, *args, **kwargs):
        with lock:
            return call(self, *args, **kwargs)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", serialised)
