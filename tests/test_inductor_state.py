"""serve() under threads, re-entry, forks and many servings: what is the process's (Inductor's lookup
table, the open servings, the totals stats() reports) and what is each context's (which serving a
compile made there belongs to), as runtime.inductor's docstring states.

"Restored exactly" means the user's own table object comes back (`is`), its entries as they were
(`==` a deep copy taken before): flytune never writes into it.
"""
from __future__ import annotations

import asyncio
import copy
import gc
import os
import threading
import time
import warnings

import pytest

import flytune_build as ft

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.runtime.triton_heuristics")

from test_inductor import SUM, bundle_dir, load_kernel, lookup_key  # noqa: E402,F401 - bundle_dir: the fixture

MINE = {"ab" * 32: {"XBLOCK": 128, "num_warps": 2, "num_stages": 1}}  # an entry of the user's own


def table():
    return torch._inductor.config.autotune_lookup_table


def served(config_list) -> bool:
    return [(c.kwargs, c.num_warps, c.num_stages) for c in config_list] == [({"XBLOCK": 512}, 8, 1)]


class _OneTable:
    """Inductor's lookup table kept once per process, as torch releases before per-thread config keep it."""

    def __init__(self, table):
        self.table = table

    def get(self):
        return self.table

    def set(self, table):
        self.table = table


@pytest.fixture(params=["this torch", "one table per process"])
def lookup(request, monkeypatch):
    """(read the table a compile here reads, set the user's own table) in this torch, and in a torch
    whose config is one per process (the two accessors runtime.inductor.hooks reads it through)."""
    from flytune_build.runtime.inductor import hooks

    if request.param == "this torch":
        def own(t):
            torch._inductor.config.autotune_lookup_table = t

        saved = torch._inductor.config.autotune_lookup_table
        yield table, own
        torch._inductor.config.autotune_lookup_table = saved
        return
    one = _OneTable({})
    monkeypatch.setattr(hooks, "lookup_table", one.get)
    monkeypatch.setattr(hooks, "set_lookup_table", one.set)
    monkeypatch.setattr(hooks, "table_scope", lambda: "process")
    yield one.get, one.set


def test_servings_entered_from_many_threads_leave_the_users_own_table_exactly(bundle_dir, lookup):  # noqa: F811
    """8 threads, each entering its own serving 1,000 times (half a fresh serve() each time, half one
    serving re-entered, nested every tenth time): no error; while open, each sees the shipped winner and
    the user's own entries; the user's own table object comes back unchanged, on every thread (where
    torch keeps a table per thread, each thread's own; else the one of the process)."""
    from flytune_build.runtime import inductor as rt
    from flytune_build.runtime.inductor import hooks

    read, own = lookup
    key, mine = lookup_key(), copy.deepcopy(MINE)
    own(mine)
    threads, rounds = 8, 1000
    start = threading.Barrier(threads)
    errors: list[BaseException] = []
    per_thread = hooks.table_scope() == "context"

    def run(fresh: bool, k) -> None:
        try:
            if per_thread:
                own(copy.deepcopy(MINE))  # this thread's own table: what a compile on it reads
            users = read()
            before = copy.deepcopy(users)
            single = None if fresh else rt.serve()
            start.wait()
            for i in range(rounds):
                with (rt.serve() if fresh else single) as s:
                    assert rt.current() is s
                    if i % 10 == 0:
                        with s:
                            assert rt.current() is s
                    seen = read()
                    assert seen[key] == {"XBLOCK": 512, "num_warps": 8, "num_stages": 1}
                    assert all(seen[k2] == v for k2, v in before.items())
                    s.before_precompile(k)
                assert rt.current() is None
            if per_thread:  # else the table is the process's: the other threads may still serve
                assert read() is users and users == before
        except BaseException as e:
            errors.append(e)

    # built here: load_kernel switches TRITON_INTERPRET off for a moment, which threads must not race
    workers = [threading.Thread(target=run, args=(i % 2 == 0, load_kernel())) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert read() is mine and mine == MINE
    counted = ft.stats()["torch.compile"]["kernels"]
    assert counted == {"offline": threads // 2 * rounds + threads // 2, "autotune": 0, "single": 0}


def test_a_serving_entered_twice_serves_until_its_second_exit(bundle_dir):  # noqa: F811 - the fixture
    from flytune_build import inductor as ft_inductor
    from flytune_build.runtime import inductor as rt

    s = ft_inductor.serve()
    with s:
        with s:
            pass
        assert lookup_key() in table() and rt.current() is s  # the outer block still serves
        k = load_kernel()
        assert served(k.configs)
        s.before_precompile(k)
    assert table() == {} and rt.current() is None and len(load_kernel().configs) > 1
    s.open()
    s.open()
    s.close()
    assert lookup_key() in table()
    s.close()
    s.close()  # one close too many: nothing more to close
    assert table() == {} and s.stats()["kernels"]["offline"] == 1


def test_a_thread_that_opened_no_serving_compiles_outside_every_one(bundle_dir):  # noqa: F811 - the fixture
    """Which serving counts a compile is the compiling context's: none on a plain thread that opened none,
    its own on one that opened one, the opener's on a thread run in the opener's context. What the
    plain thread's compile reads is the table torch keeps for it: the process's (served all the same)
    or, where torch keeps one per thread, its own (not served)."""
    import contextvars

    from flytune_build import inductor as ft_inductor
    from flytune_build.runtime import inductor as rt

    seen = {}

    def plain():
        seen["plain"] = (rt.current(), served(load_kernel().configs))

    def own():
        with ft_inductor.serve() as mine:
            seen["own"] = rt.current() is mine and served(load_kernel().configs)

    def carried():
        seen["carried"] = (rt.current(), served(load_kernel().configs))
    # one thread at a time (each is joined before the next starts): load_kernel's moment without
    # TRITON_INTERPRET meets no other thread

    with ft_inductor.serve() as s:
        for fn in (plain, own, contextvars.copy_context().run):
            t = threading.Thread(target=fn, args=(carried,) if fn is not plain and fn is not own else ())
            t.start()
            t.join()
        assert rt.current() is s
    assert seen == {"plain": (None, rt.table_scope() == "process"), "own": True, "carried": (s, True)}
    assert s.stats()["kernels"] == {"offline": 0, "autotune": 0, "single": 0}


def test_each_asyncio_task_has_its_own_innermost_serving(bundle_dir):  # noqa: F811 - the fixture
    from flytune_build import inductor as ft_inductor
    from flytune_build.runtime import inductor as rt

    async def task(gate: asyncio.Event, other: asyncio.Event):
        with ft_inductor.serve() as s:
            gate.set()
            await other.wait()  # the other task opens its serving meanwhile
            return rt.current() is s

    async def both():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task(a, b), task(b, a))

    assert asyncio.run(both()) == [True, True]
    assert table() == {}


def test_stats_stay_bounded_after_ten_thousand_servings(bundle_dir):  # noqa: F811 - the fixture
    """Closed servings are folded into fixed totals: 10,000 servings, each counting a served and an
    autotuned kernel, leave no object per serving behind, and stats() is as small as after one."""
    from flytune_build import inductor as ft_inductor

    gelu, red = load_kernel(), load_kernel(SUM)

    def serve_once():
        with ft_inductor.serve() as s:
            s.before_precompile(gelu)
            s.before_precompile(red)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each close says what missed (once per process)
        for _ in range(100):
            serve_once()
        gc.collect()
        objects = len(gc.get_objects())  # a leak of one object per serving would add 10,000
        for _ in range(10_000):
            serve_once()
        gc.collect()
        grown = len(gc.get_objects()) - objects
    assert grown < 500, grown
    assert ft.stats()["torch.compile"] == {"kernels": {"offline": 10_100, "autotune": 10_100, "single": 0},
                                           "autotuned": ["triton_red_fused_sum_1"]}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_closes_what_the_forking_thread_opened_while_another_held_the_lock(bundle_dir):  # noqa: F811
    from flytune_build.runtime.inductor import serving

    mine = copy.deepcopy(MINE)
    held, release = threading.Event(), threading.Event()

    def hold():
        with serving._state.lock:  # a parent thread inside the lock at the moment of the fork
            held.set()
            release.wait()

    with torch._inductor.config.patch(autotune_lookup_table=mine):
        s = serving.serve().open()
        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        pid = os.fork()
        if pid == 0:  # the child: its own lock, the forking thread's serving open
            ok = False
            try:
                ok = lookup_key() in table()
                with serving.serve():
                    ok = ok and lookup_key() in table()
                s.close()
                ok = ok and table() is mine
            finally:
                os._exit(0 if ok else 1)
        try:
            deadline = time.monotonic() + 120
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            if done[0] == 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on a lock a parent thread held at the fork")
            assert os.waitstatus_to_exitcode(done[1]) == 0
        finally:
            release.set()
            holder.join()
        assert lookup_key() in table()  # the parent's serving is the parent's: still open here
        s.close()
        assert table() is mine
