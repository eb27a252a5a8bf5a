"""Threads meeting a ported kernel's miss path, `forcing` and the first settle; locks in a forked child.

Each interleaving is forced with events, never with sleeps: a test waits until every other thread is
blocked where the code under test makes it block (or where the old code would have let it through),
then releases the one it holds. Kernels are real, on Triton's interpreter; its launches are serialised
(it keeps a launch's grid in process globals; a GPU needs no such lock)."""
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from conftest import python_env
from kernels import _add, grid, make_add

import flytune_build as ft
from flytune_build import Config
from flytune_build.core import settings

N = 50
WAIT = 120  # seconds: only a broken build waits this long


pytestmark = pytest.mark.usefixtures("serialised_launches")   # conftest: the interpreter's launches, one at a time


def add(k, n=N):
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    k[grid(n)](x, y, out, n)
    assert torch.equal(out, x + y)


def decided(k, n=N):
    return k.decision(torch.empty(n), torch.empty(n), torch.empty(n), n)


class Threads:
    """Threads running `fn(*args)`, each one's exception kept."""

    def __init__(self, fn, *args, count=1):
        self.errors = []
        self.threads = [threading.Thread(target=self._run, args=(fn, args), daemon=True) for _ in range(count)]

    def _run(self, fn, args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def join(self):
        for t in self.threads:
            t.join(WAIT)
        assert not any(t.is_alive() for t in self.threads), "a thread never finished (a deadlock)"


def until_blocked(threads, *where):
    """Wait until each of `threads` has ended or is inside one of `where` ((function name, file suffix))."""
    deadline = time.monotonic() + WAIT
    while True:
        frames = sys._current_frames()
        if all(not t.is_alive() or _inside(frames.get(t.ident), where) for t in threads):
            return
        assert time.monotonic() < deadline, f"threads never reached {where}"
        threading.Event().wait(0.002)


def _inside(frame, where) -> bool:
    while frame is not None:
        if any(frame.f_code.co_name == name and frame.f_code.co_filename.endswith(file) for name, file in where):
            return True
        frame = frame.f_back
    return False


WAITING = ("enter", "serving/decision.py")   # a caller waiting for another thread's decision of its key


def test_concurrent_first_calls_of_one_key_decide_it_once_and_every_caller_is_served_it():
    """Four threads miss one key while a first is deciding it (its `default` held): the `default` runs
    once, one decision is counted and told to `on_decision`, and all five calls launch it."""
    entered, release, seen = threading.Event(), threading.Event(), []

    def slow_default(bound):
        seen.append(threading.current_thread().name)
        entered.set()
        release.wait(WAIT)
        return Config({"BLOCK": 32}, num_warps=1)
    k = make_add("s2.once", key=("n",), default=slow_default)
    events = []
    with ft.on_decision(events.append):
        first = Threads(add, k).start()
        assert entered.wait(WAIT)
        later = Threads(add, k, count=4).start()
        until_blocked(later.threads, WAITING, ("slow_default", "test_state_ii.py"))
        release.set()
        first.join()
        later.join()
    assert first.errors == later.errors == []
    assert len(seen) == 1 and len(events) == 1 and len(k._stats.decisions) == 1
    assert decided(k).calls == 5 and ft.stats()["s2.once"]["calls"]["heuristic"] == 5


def test_concurrent_first_calls_under_search_search_once(monkeypatch):
    """FLYTUNE_AUTOTUNE=1: four threads making one key's first call at once run one search; the others
    wait for its winner (the review saw one search per thread)."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    release, timed = threading.Event(), []

    def held_bench(fn, quantiles=None):
        release.wait(WAIT)
        fn()
        timed.append(1)
        return [float(len(timed))] * 3
    k = ft.autotune([Config({"BLOCK": b}, num_warps=1) for b in (16, 32)], ["n"], name="s2.search",
                    do_bench=held_bench)(_add)
    callers = Threads(add, k, count=4).start()
    until_blocked(callers.threads, WAITING, ("held_bench", "test_state_ii.py"))
    release.set()
    callers.join()
    assert callers.errors == []
    stats = ft.stats()["s2.search"]
    assert stats["searches"] == 1 and len(k._stats.decisions) == 1, stats
    assert stats["calls"]["search"] + stats["calls"]["scratch"] == 4, stats


def test_a_nested_call_of_the_key_being_decided_goes_through_and_the_first_decision_stands():
    """A `default` calling its own kernel with the key it is deciding (same thread) does not wait for
    itself; the decision it stores is the key's, and the outer call is served it: one decision."""
    nested = []

    def default(bound):
        if not nested:
            nested.append(1)
            add(k)
        return Config({"BLOCK": 16 * len(nested)}, num_warps=1)
    k = make_add("s2.nested", key=("n",), default=default)
    events = []
    with ft.on_decision(events.append):
        caller = Threads(add, k).start()
        caller.join()
    assert caller.errors == []
    assert len(events) == 1 and len(k._stats.decisions) == 1 and decided(k).calls == 2


def test_two_threads_each_deciding_a_key_the_other_calls_do_not_wait_on_each_other():
    """Thread A decides n=50 and its `default` calls n=60, which thread B is deciding, whose `default`
    calls n=50: a thread already deciding never waits, so neither deadlocks."""
    both = threading.Barrier(2, timeout=WAIT)
    inner = threading.local()

    def default(bound):
        if not getattr(inner, "done", False):
            inner.done = True
            both.wait()     # each thread is inside its own key's decision
            add(k, 110 - bound["n"])
        return Config({"BLOCK": 32}, num_warps=1)
    k = make_add("s2.cross", key=("n",), default=default)
    a, b = Threads(add, k, 50).start(), Threads(add, k, 60).start()
    a.join()
    b.join()
    assert a.errors == b.errors == []
    assert decided(k, 50) is not None and decided(k, 60) is not None


def test_a_decider_that_raises_releases_its_waiters_which_decide_the_key_themselves():
    """The first thread's `default` raises while three others wait for its decision: it sees its error;
    the others are released, one of them decides the key (once) and all three are served."""
    entered, release, again, seen = threading.Event(), threading.Event(), threading.Event(), []

    def failing_once(bound):
        seen.append(1)
        if len(seen) == 1:
            entered.set()
            release.wait(WAIT)
            raise RuntimeError("the first default fails")
        again.wait(WAIT)  # where every caller deciding for itself would meet
        return Config({"BLOCK": 32}, num_warps=1)
    k = make_add("s2.raises", key=("n",), default=failing_once)
    first = Threads(add, k).start()
    assert entered.wait(WAIT)
    later = Threads(add, k, count=3).start()
    until_blocked(later.threads, WAITING, ("failing_once", "test_state_ii.py"))
    release.set()
    again.set()
    first.join()
    later.join()
    assert [str(e) for e in first.errors] == ["the first default fails"] and later.errors == []
    assert len(seen) == 2 and len(k._stats.decisions) == 1 and decided(k).calls == 3


def test_a_decision_begun_before_forcing_is_not_remembered_inside_it():
    """A serving thread is inside a `default` when `forcing(BLOCK=64)` opens: its decision is not
    stored in the block's (emptied) memo, its call and the next one inside the block launch the forced
    config, and after the block the key is decided afresh (the review saw BLOCK=16 served inside)."""
    entered, release = threading.Event(), threading.Event()

    def held_default(bound):
        entered.set()
        release.wait(WAIT)
        return Config({"BLOCK": 16}, num_warps=1)
    k = make_add("s2.forcing", key=("n",), default=held_default)
    serving = Threads(add, k).start()
    assert entered.wait(WAIT)
    with k.forcing(Config({"BLOCK": 64}, num_warps=1)) as forced:
        release.set()
        serving.join()
        add(k)
        assert decided(k) is None and forced.calls == 2
    assert serving.errors == [] and decided(k) is None and k._stats.decisions == []
    add(k)
    assert decided(k).config == Config({"BLOCK": 16}, num_warps=1) and len(k._stats.decisions) == 1


def test_forcing_blocks_closed_out_of_order_each_serve_while_open_and_the_memo_comes_back():
    """Two `forcing` blocks (two verifying threads) opened a then b, closed a then b: after a closes,
    b's config still serves; after b closes, the decisions set aside serve again, nothing forced."""
    k = make_add("s2.blocks", key=("n",), default=lambda bound: Config({"BLOCK": 16}, num_warps=1))
    add(k)
    before = decided(k)
    a = k.forcing(Config({"BLOCK": 32}, num_warps=1))
    b = k.forcing(Config({"BLOCK": 64}, num_warps=1))
    forced_a, forced_b = a.__enter__(), b.__enter__()
    a.__exit__(None, None, None)
    add(k)
    assert forced_b.calls == 1 and forced_a.calls == 0
    b.__exit__(None, None, None)
    add(k)
    assert decided(k) is before and before.calls == 2 and forced_b.calls == 1


def test_a_first_decision_meeting_another_thread_settling_waits_for_its_listeners():
    """Settings changed after import: thread A settles and its `on_change` listeners (forgetting what
    was derived from the old settings) are running when thread B makes its first decision. B waits for
    them and decides under the new settings (the review saw B decide before they ran: a key served by
    the old offline tier, for good)."""
    settings.reload()
    assert settings.current().ranking == "measured"
    entered, release, finished, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def held_listener():
        entered.set()
        release.wait(WAIT)
        finished.set()
    settings.on_change(held_listener)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("FLYTUNE_RANKING", "synthetic")  # set after import, before the first call
            a = Threads(settings.settle).start()
            assert entered.wait(WAIT)

            def first_decision():
                settings.settle()
                seen.update(listeners_ran=finished.is_set(), ranking=settings.current().ranking)
            b = Threads(first_decision).start()
            until_blocked(b.threads, ("settle", "core/settings.py"))
            release.set()
            a.join()
            b.join()
        assert a.errors == b.errors == [] and seen == {"listeners_ran": True, "ranking": "synthetic"}
    finally:
        release.set()
        settings._listeners.remove(held_listener)


FORKED = '''
import os, sys, threading, warnings
from flytune_build.core import settings, streams
from flytune_build.runtime import warning
from flytune_build.runtime.serving import decision

warnings.simplefilter("ignore")
which = sys.argv[1]
if which == "flights":
    flights = decision.Flights({})
    flights.pending[("n", 1)] = threading.Event()   # a key a thread of the parent is deciding
def lock():
    return {"settings": lambda: settings._lock, "streams": lambda: streams._lock,
            "warning": lambda: warning._lock, "flights": lambda: flights.lock}[which]()
holding, forked, held = threading.Event(), threading.Event(), lock()
def inside():                                        # a thread of the parent inside it at fork time
    with held:
        holding.set()
        forked.wait()
helper = threading.Thread(target=inside)
helper.start()
holding.wait()
pid = os.fork()
if pid == 0:
    free = lock().acquire(blocking=False)
    if free:
        lock().release()
        settings.settle()
        warning.once("a cause of the child's", "said in the child")
        with streams.to_stderr():
            pass
    os._exit(0 if free and (which != "flights" or flights.pending == {}) else 3)
forked.set()
helper.join()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
'''


@pytest.mark.parametrize("which", ["settings", "streams", "warning", "flights"])
def test_a_forked_child_gets_fresh_locks_and_no_key_being_decided(which):
    """os.fork() while a thread of the parent holds the settings', the stdout router's, the warnings'
    or a kernel's decision lock (deciding a key): in the child that lock is free and no key waits on a
    thread the child does not have; the child settles, warns and diverts stdout without hanging."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FORKED), which], capture_output=True, text=True,
                       env=python_env(), timeout=WAIT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0"], r.stdout + r.stderr[-3000:]


def test_a_decision_racing_reset_stats_is_in_both_the_memo_and_the_counters_or_in_neither(monkeypatch):
    """reset_stats() on one thread; another thread's first call lands right after the memo was emptied:
    its decision is counted in the counters reset_stats made, not in the ones it threw away."""
    from flytune_build.runtime.serving.decision import Flights

    k = make_add("s2.reset", key=("n",), default=lambda bound: Config({"BLOCK": 32}, num_warps=1))
    reset, go, back = Flights.reset, threading.Event(), threading.Event()

    def paused(self, then=None):
        reset(self, then)
        if threading.current_thread().name == "resetting" and self is k._flights:
            go.set()
            assert back.wait(WAIT)
    monkeypatch.setattr(Flights, "reset", paused)

    def caller():
        assert go.wait(WAIT)
        add(k)
        back.set()
    calling = Threads(caller).start()
    resetting = threading.Thread(target=ft.reset_stats, name="resetting")
    resetting.start()
    resetting.join(WAIT)
    calling.join()
    assert calling.errors == []
    monkeypatch.setattr(Flights, "reset", reset)
    add(k)
    add(k)
    assert decided(k).calls == 3 and ft.stats()["s2.reset"]["calls"]["heuristic"] == 3


# -- reset_stats racing calls, registrations and subscribers ---------------------------------------------------
def test_a_call_deciding_while_reset_stats_runs_never_leaves_the_old_offline_tier_behind(tmp_path, monkeypatch):
    """A call landing inside `reset_stats` (here while it reads the settings again) decides from the old
    tier or the new, but after `reset_stats` returns every kernel reads the new one."""
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.device import INTERPRETER

    k = make_add("st2.reset", key=("n",), default=lambda b: Config({"BLOCK": 16}, num_warps=1))
    add(k, 64)
    d = tmp_path / "arts"
    for n in (64, 128):
        Artifact("st2.reset", {"n": n}, INTERPRETER, Config({"BLOCK": 64}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    inside, go, real = threading.Event(), threading.Event(), settings.reload

    def slow_reload():
        inside.set()
        go.wait(WAIT)
        return real()
    monkeypatch.setattr(settings, "reload", slow_reload)
    resetting = Threads(ft.reset_stats)
    resetting.start()
    assert inside.wait(WAIT)
    calling = Threads(add, k, 64)
    calling.start()
    calling.threads[0].join(0.5)
    go.set()
    resetting.join()
    calling.join()
    assert not resetting.errors and not calling.errors
    add(k, 128)   # a key no call decided before: from the tier reset_stats read again
    assert decided(k, 128).tier == "offline"


def test_an_index_built_while_the_kernel_is_reset_serves_its_call_and_is_not_kept():
    from flytune_build.runtime.serving.offline import Index, Slot

    slot, reported = Slot(), []

    def build():
        slot.clear()   # reset_stats, meanwhile
        return Index()
    first = slot.get(build, reported.append)
    assert isinstance(first, Index) and reported == [first]
    second = slot.get(Index, reported.append)
    assert second is not first and reported == [first, second] and slot.get(Index, reported.append) is second


def test_reset_stats_while_another_thread_registers_kernels():
    for i in range(20):
        make_add(f"st2.base{i}")
    stop = threading.Event()

    def register():
        i = 0
        while not stop.is_set():
            make_add(f"st2.late{i}")
            i += 1
    registering = Threads(register)
    registering.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(100):
            ft.reset_stats()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        registering.join()
    assert not registering.errors


def test_a_subscriber_that_raises_keeps_no_other_from_hearing_of_the_decision():
    k = make_add("st2.told", key=("n",), default=lambda b: Config({"BLOCK": 16}, num_warps=1))
    heard = []

    def failing(event):
        raise RuntimeError("the first subscriber's own error")
    with ft.on_decision(failing), ft.on_decision(lambda event: heard.append(event["key"])):
        with pytest.raises(RuntimeError, match="own error"):
            add(k, 64)
    assert heard == [{"n": 64}]
