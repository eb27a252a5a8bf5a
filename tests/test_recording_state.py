"""`recording`, the misses log and the scratch cache under threads and forks: a block's searches run one
call at a time and each call captures its own key's winner; a block forked away from its thread is
undone in the child; what a recorded search serves is what is told; a pool's worker flushes its misses
however late it met the misses module; a reset keeps a concurrent miss's calls; no misses lock is held
across another hook's fork wait; a scratch write never loses another thread's winner in memory."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import triton
from conftest import python_env

import flytune_build as ft
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER
from test_adopted_dispatch import make  # an add kernel of three configs, keyed on n

WANT = {100: 16, 200: 32, 300: 64, 400: 16, 500: 32, 600: 64}   # each shape's fastest block, by the timer below


pytestmark = pytest.mark.usefixtures("serialised_launches")   # conftest: the interpreter's launches, one at a time


def timer(times):
    """A `do_bench` timing each config by (n, BLOCK) from the call Triton's timer runs: deterministic."""
    def do_bench(kernel_call, quantiles=None):
        cells = dict(zip(kernel_call.__code__.co_freevars, (c.cell_contents for c in kernel_call.__closure__)))
        kernel_call()
        time.sleep(0.001)   # room for another thread's call to interleave
        t = times(cells["full_nargs"]["n"], cells["config"].kwargs["BLOCK"])
        return [t, t, t]
    return do_bench


def call(k, n):
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n)
    assert torch.equal(out, x + y)
    return k.best_config.kwargs["BLOCK"]


def test_a_block_recording_many_threads_captures_each_keys_own_winner_once(monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")
    ft.reset_stats()
    k = make(do_bench=timer(lambda n, b: 1.0 if WANT[n] == b else 10.0))
    adapter.adopt(k, name="rs.threads")
    errors = []

    def worker(n):
        try:
            call(k, n)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    with adapter.recording(k, "rs.threads") as captured:
        threads = [threading.Thread(target=worker, args=(n,)) for n in WANT for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        cached = {key[0]: c.kwargs["BLOCK"] for key, c in k.cache.items()}
    assert not errors and not any(t.is_alive() for t in threads)
    assert cached == WANT   # Triton's cache holds each key's own winner (before: another key's, for good)
    assert sorted((a.key["n"], a.config.kwargs["BLOCK"]) for a in captured) == sorted(WANT.items())   # once each


def test_a_recorded_search_is_told_as_the_config_it_serves_and_is_no_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    monkeypatch.setenv("FLYTUNE_MISSES", str(tmp_path / "misses.json"))
    ft.reset_stats()
    # 32 is Triton's minimum, within flytune's margin of the first config timed (16), which flytune keeps
    k = make(do_bench=timer(lambda n, b: {16: 1.00, 32: 0.99, 64: 5.0}[b]))
    adapter.adopt(k, name="rs.told")
    events = []
    with ft.on_decision(events.append), adapter.recording(k, "rs.told") as captured:
        call(k, 100)
        served = call(k, 100)
    from flytune_build.runtime.serving import misses

    misses.flush()
    assert captured[0].config.kwargs["BLOCK"] == served == 16
    assert [(e["tier"], e["config"].kwargs["BLOCK"]) for e in events] == [("search", 16)]   # not Triton's 32
    assert not (tmp_path / "misses.json").exists()   # a tuning run's search, not a production miss
    assert ft.stats()["rs.told"]["searches"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_records_has_the_kernel_as_before_the_block(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "arts"))
    Artifact("rs.fork", {"n": 100, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
             Config({"BLOCK": 64}, num_warps=1)).save(tmp_path / "arts")
    ft.reset_stats()
    timed = []
    k = make(do_bench=lambda fn, quantiles=None: (timed.append(1), fn(), [1.0] * 3)[2])
    assert adapter.adopt(k, name="rs.fork") == 1
    inside, leave = threading.Event(), threading.Event()

    def recorder():
        with adapter.recording(k, "rs.fork"):
            inside.set()
            leave.wait(60)
    t = threading.Thread(target=recorder)
    t.start()
    assert inside.wait(30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: no thread ends the block there
        try:
            timed.clear()
            block = call(k, 100)
            with adapter.recording(k, "rs.fork"):
                pass
            os.write(w, json.dumps([block, len(timed)]).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got = os.read(r, 1000)
    leave.set()
    t.join(60)
    assert json.loads(got) == [64, 0]   # its artifact served, nothing timed; and it can record again


POOL = textwrap.dedent('''
    import json, os, sys
    import torch
    from kernels import make_add, grid
    k = make_add("rs.pool", key=("n",))
    def call(n):
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        k[grid(n)](x, y, out, n)
    if __name__ == "__main__":
        import multiprocessing as mp
        pool = mp.get_context(sys.argv[1]).Pool(2)   # the parent made no call: the workers meet misses first
        pool.map(call, [100] * 12, chunksize=1)
        pool.close()
        pool.join()
        doc = json.load(open(os.environ["FLYTUNE_MISSES"]))
        print(sum(m["calls"] for m in doc["misses"]))
''')


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_pool_worker_that_meets_the_misses_log_first_flushes_it_when_joined(tmp_path, method):
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=tmp_path / "m.json",
                     FLYTUNE_CACHE_DIR=tmp_path / "c")
    env["PYTHONPATH"] = os.pathsep.join([str(os.path.dirname(__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "12"   # before: 2 of 12 (each worker's first write only)


FORK_WAIT = textwrap.dedent('''
    import os, threading, time
    os.register_at_fork(before=lambda: time.sleep(2.0))   # a hook that waits, as warming.forks' does for an import
    import torch
    from kernels import make_add, grid
    k = make_add("rs.forkwait", key=("n",))
    def call(n):
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        k[grid(n)](x, y, out, n)
    call(10)   # the misses log met (its at-fork hooks, if any, registered after the waiting one: they run first)
    forking = threading.Event()
    def fork():
        forking.set()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    t = threading.Thread(target=fork)
    t.start()
    forking.wait()
    time.sleep(0.3)   # the fork's hooks under way
    start = time.perf_counter()
    call(20)          # a new key's first call: a miss recorded
    print(round(time.perf_counter() - start, 3))
    t.join()
''')


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_miss_recorded_while_another_thread_forks_never_waits_for_the_forks_hooks(tmp_path):
    script = tmp_path / "forkwait.py"
    script.write_text(FORK_WAIT)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=tmp_path / "m.json",
                     FLYTUNE_CACHE_DIR=tmp_path / "c")
    env["PYTHONPATH"] = os.pathsep.join([str(os.path.dirname(__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split()[-1]) < 1.0, r.stdout   # before: the 2 s the other hook waited (misses' lock held)


def test_a_scratch_write_never_loses_another_threads_winner_in_memory(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import scratch

    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path))
    ft.reset_stats()
    cache = scratch.ScratchCache("rs.scratch")
    first, second = threading.Event(), threading.Event()
    write = cache._write   # noqa: SLF001 - the window between one thread's write and its own memory

    def slow(key, value):
        write(key, value)
        if key == "a":
            first.set()
            second.wait(10)
    cache._write = slow   # noqa: SLF001
    a = threading.Thread(target=cache.put, args=("a", 1))
    a.start()
    assert first.wait(10)
    cache.put("b", 2)
    second.set()
    a.join(10)
    assert cache.get("a") == 1 and cache.get("b") == 2
