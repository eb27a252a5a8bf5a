"""FLYTUNE_MISSES inside real services: exact counts across fork, exit and the key cap; one lock per real
file whatever link names it; a kernel call that never waits on another process's lock."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings

import pytest
import torch

import flytune_build as ft
from conftest import ROOT, python_env
from flytune_build.core import misses as misses_file
from flytune_build.core.config import Config
from kernels import make_add


@pytest.fixture(autouse=True)
def _forget_misses():
    from flytune_build.runtime.serving import misses

    misses.reset()
    yield
    misses.reset()  # this test's misses are not written by a later test's flush, nor at exit


def add(k, n, times=1):
    x = torch.randn(n)
    out = torch.empty_like(x)
    for _ in range(times):
        k[lambda m: ((n + m["BLOCK"] - 1) // m["BLOCK"],)](x, x, out, n)
    assert torch.allclose(out, 2 * x)


def rows(path):
    return {m.key["n"]: (m.calls, m.decisions) for m in misses_file.misses(misses_file.load(path))}


FORK = """
import os, sys, time, torch
sys.path.insert(0, sys.argv[3])
from kernels import make_add
from flytune_build import Config
from flytune_build.core import misses as misses_file
from flytune_build.runtime.serving import misses

k = make_add("t.fork.add", default=lambda a: Config({"BLOCK": 32}))

def call(n, times):
    x = torch.randn(n); out = torch.empty_like(x)
    for _ in range(times):
        k[lambda m: ((n + m["BLOCK"] - 1) // m["BLOCK"],)](x, x, out, n)

def landed(n):
    return any(m.key["n"] == n for m in misses_file.misses(misses_file.load(misses_file.real(sys.argv[1]))))

def worker(how):
    call(100, 3)
    if how == "sys.exit":
        sys.exit(0)          # a worker function's normal end: the exit's flush runs (inherited atexit)
    if how == "flush+os._exit":
        misses.flush()       # as a pre-fork server's worker does before os._exit
        os._exit(0)
    call(7, 1)               # os._exit, no flush: a new decision wakes the writer thread, which writes
    deadline = time.monotonic() + 120
    while not landed(7) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0 if landed(7) else 3)

how = sys.argv[2]
call(100, 5)
if how == "multiprocessing":  # its fork child returns from the target, runs its finalizers, then os._exit
    import multiprocessing
    workers = [multiprocessing.get_context("fork").Process(target=call, args=(100, 3))
               for _ in range(int(sys.argv[4]))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        assert w.exitcode == 0, w.exitcode
    sys.exit(0)
children = []
for _ in range(int(sys.argv[4])):
    pid = os.fork()
    if pid == 0:
        worker(how)  # sys.exit's SystemExit ends the child as it would end any process: atexit runs
    children.append(pid)
for pid in children:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
"""


@pytest.mark.parametrize("how", ["sys.exit", "flush+os._exit", "os._exit", "multiprocessing"])
def test_a_forked_worker_counts_only_its_own_calls_and_never_its_parents(tmp_path, how):
    """5 calls, a fork, the worker's 3 calls: 8 in the file, one decision, however the worker exits: at
    exit (sys.exit), flushed before os._exit, as a multiprocessing child's finalizer; with os._exit and no
    flush, the worker's calls land with its next decision, which its writer thread writes."""
    path = tmp_path / "misses.json"
    script = tmp_path / "fork.py"
    script.write_text(FORK)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=path, FLYTUNE_CACHE_DIR=tmp_path / "c")
    r = subprocess.run([sys.executable, str(script), str(path), how, str(ROOT / "tests"), "1"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = rows(path)
    assert got[100] == (8, 1), got
    if how == "os._exit":
        assert got[7][1] == 1 and got[7][0] <= 1, got  # its one call: counted, or lost with os._exit
    assert misses_file.load(path)["dropped"] == 0


def test_two_forked_workers_and_their_parent_each_count_their_own(tmp_path):
    path = tmp_path / "misses.json"
    script = tmp_path / "fork.py"
    script.write_text(FORK)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=path, FLYTUNE_CACHE_DIR=tmp_path / "c")
    r = subprocess.run([sys.executable, str(script), str(path), "sys.exit", str(ROOT / "tests"), "2"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert rows(path) == {100: (5 + 2 * 3, 1)}


WRITER_IMPORTS = """
import sys, threading, time, torch
sys.path.insert(0, sys.argv[2])
from kernels import make_add
from flytune_build import Config
from flytune_build.core import misses as misses_file

seen = []
sys.addaudithook(lambda event, args: seen.append((threading.current_thread().name, args[0]))
                 if event == "import" else None)
k = make_add("t.writer.add", default=lambda a: Config({"BLOCK": 32}))
for n in (100, 7, 300):   # three decisions, three wakes of the writer thread
    x = torch.randn(n); out = torch.empty_like(x)
    k[lambda m: ((n + m["BLOCK"] - 1) // m["BLOCK"],)](x, x, out, n)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            m.key["n"] == n for m in misses_file.misses(misses_file.load(misses_file.real(sys.argv[1])))):
        time.sleep(0.02)
print(sorted({name for thread, name in seen if thread == "flytune-misses"}))
"""


def test_the_writer_thread_imports_nothing_a_forked_child_could_wait_for(tmp_path):
    """A fork made while another thread imports a module leaves the child waiting forever on that module's
    import lock, whose holder is not in the child (a forked worker's exit flush hung so, importing filelock
    the parent's writer thread was importing). The writer thread imports nothing: every import it would
    make is seen here (an audit hook names the importing thread)."""
    path = tmp_path / "misses.json"
    script = tmp_path / "writer.py"
    script.write_text(WRITER_IMPORTS)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=path, FLYTUNE_CACHE_DIR=tmp_path / "c")
    r = subprocess.run([sys.executable, str(script), str(path), str(ROOT / "tests")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
    assert rows(path) == {100: (1, 1), 7: (1, 1), 300: (1, 1)}


def test_a_process_flushing_twice_counts_each_call_and_decision_once(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.state.twice", default=lambda a: Config({"BLOCK": 32}))
    add(k, 100, times=2)
    misses.flush()
    misses.flush()  # nothing new: nothing added
    add(k, 100, times=3)
    add(k, 50)
    misses.flush()
    assert rows(path) == {100: (5, 1), 50: (1, 1)}


def test_a_symlink_and_its_target_are_one_file_with_one_lock(tmp_path, monkeypatch):
    """A process naming FILE through a link waits for the lock of the file the link names: with that lock
    held its write fails (and says so, once), and once free every call lands."""
    from filelock import FileLock

    from flytune_build.runtime.serving import misses

    real = tmp_path / "data" / "misses.json"
    real.parent.mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert misses_file.lock_file(link) == misses_file.lock_file(real) == misses_file.real(real).with_name(
        "misses.json.lock")
    monkeypatch.setattr(misses_file, "LOCK_TIMEOUT", 0.2)
    monkeypatch.setenv("FLYTUNE_MISSES", str(link))
    k = make_add("t.state.link", default=lambda a: Config({"BLOCK": 32}))
    held = FileLock(str(real) + ".lock")
    with held:
        with pytest.warns(ft.FlytuneWarning, match="cannot record.*held its lock"):
            add(k, 100, times=2)
            misses.flush()
        assert not real.exists()
    misses.flush()
    assert link.is_symlink() and rows(real) == {100: (2, 1)}


HOLD = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_kernel_call_never_waits_on_another_process_lock_and_the_keys_land_once_it_is_free(tmp_path,
                                                                                              monkeypatch):
    """Another process holds FILE's lock (stopped, or just slow): four first calls of new keys take far
    less than core.misses.LOCK_TIMEOUT together; the lock is waited for once, said once, and every key
    lands, with its calls, once the lock is free."""
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.state.stall", default=lambda a: Config({"BLOCK": 32}))
    add(k, 8)  # the kernel's first call: whatever it costs besides recording is paid here
    misses.flush()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path) + ".lock"], env=python_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            started = time.monotonic()
            for n in (10, 20, 30, 40):
                add(k, n)
            took = time.monotonic() - started
            assert took < 5.0 < misses_file.LOCK_TIMEOUT, took
            monkeypatch.setattr(misses_file, "LOCK_TIMEOUT", 1.0)  # the one wait: short, for this test
            misses.flush()   # waits once (the writer thread's wait, or this one), then says so
            started = time.monotonic()
            add(k, 50)
            misses.flush()   # after a timeout: only tries, never the full wait again
            assert time.monotonic() - started < misses_file.LOCK_TIMEOUT * 5
        cannot = [w for w in said if issubclass(w.category, ft.FlytuneWarning) and "cannot record" in str(w.message)]
        assert len(cannot) == 1, [str(w.message) for w in said]
        assert rows(path) == {8: (1, 1)}
    finally:
        holder.kill()
        holder.wait()
    misses.flush()
    assert rows(path) == {8: (1, 1), 10: (1, 1), 20: (1, 1), 30: (1, 1), 40: (1, 1), 50: (1, 1)}


def test_the_writer_thread_writes_a_new_decision_without_a_flush(tmp_path, monkeypatch):
    """A process that dies before its exit still leaves its decisions: the writer thread writes them."""
    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.state.thread", default=lambda a: Config({"BLOCK": 32}))
    add(k, 64)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and 64 not in rows(path):
        time.sleep(0.05)
    assert rows(path)[64][1] == 1


def test_a_key_past_the_cap_is_dropped_once_per_process_however_often_it_is_written(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    doc = misses_file.empty()
    misses_file.merge(doc, [("full", {"n": i}, "interpreter", "heuristic", 1, 1)
                            for i in range(misses_file.MAX_ENTRIES)])
    misses_file.write(path, doc)
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.state.cap", default=lambda a: Config({"BLOCK": 32}))
    for n in (100, 200):
        add(k, n, times=2)
        misses.flush()   # the decision and its calls, written
        add(k, n)
        misses.flush()   # more calls, written again
    got = misses_file.load(path)
    assert got["dropped"] == 2 and len(got["misses"]) == misses_file.MAX_ENTRIES
    assert not any(m["kernel"] == "t.state.cap" for m in got["misses"])


def test_merge_says_which_keys_fit_and_counts_each_one_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(misses_file, "MAX_ENTRIES", 2)
    doc = misses_file.empty()
    kept = misses_file.merge(doc, [("k", {"n": 1}, "d", "heuristic", 1, 1), ("k", {"n": 2}, "d", "heuristic", 1, 1),
                                   ("k", {"n": 1}, "d", "heuristic", 2, 0), ("k", {"n": 3}, "d", "heuristic", 1, 1),
                                   ("k", {"n": True}, "d", "heuristic", 1, 1)])
    assert kept == [True, True, True, False, False] and doc["dropped"] == 2
    assert [(m["key"], m["calls"]) for m in doc["misses"]] == [({"n": 1}, 3), ({"n": 2}, 1)]


def test_reset_forgets_what_is_not_written(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.state.reset", default=lambda a: Config({"BLOCK": 32}))
    add(k, 100)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and 100 not in rows(path):  # the writer thread's one write
        time.sleep(0.05)
    written = rows(path)
    assert written[100][1] == 1 and written[100][0] <= 1
    add(k, 100, times=4)  # no new decision: nothing wakes the writer thread
    misses.reset()
    misses.flush()
    assert rows(path) == written


def test_a_tuning_run_records_no_miss(tmp_path):
    """`flytune tune` with FLYTUNE_MISSES set: its searches are the run's, never a production miss."""
    path = tmp_path / "misses.json"
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache",
                     FLYTUNE_MISSES=path, PYTHONPATH=ROOT / "sample_pkg")
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(ROOT / "sample_pkg"),
                        "--kernel", "sample_pkg.rmsnorm", "--ranking", "synthetic", "--output", str(tmp_path / "out"),
                        "--allow-ci", "--no-progress", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["ok"]
    assert not path.exists() or misses_file.load(path)["misses"] == []
