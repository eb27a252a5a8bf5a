"""An adopted `@triton.autotune` kernel under threads: a call is decided by its own arguments (Triton's
Autotuner keeps the arguments of the call its `run` serves in one attribute, `nargs`, which another
thread's call sets too), a call made while another thread reads the offline tier again waits for that
read, and a searched winner is recorded as the config Triton's cache holds for its own key."""
import threading

import pytest
import torch
import triton
import triton.language as tl

import flytune_build as ft
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER
from flytune_build.runtime.adapters import adopted as adopted_module
from test_adopted_dispatch import make  # an adopted add kernel of three configs, keyed on n


pytestmark = pytest.mark.usefixtures("serialised_launches")   # conftest: the interpreter's launches, one at a time


def args_of(n):
    return torch.randn(n), torch.randn(n), torch.empty(n), n


def call(k, n):
    x, y, out, _ = a = args_of(n)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](*a)
    assert torch.equal(out, x + y)
    return k.best_config.kwargs["BLOCK"]


def bundle(tmp_path, monkeypatch, blocks: dict):
    d = tmp_path / "arts"
    for n, block in blocks.items():
        Artifact("st.add", {"n": n, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
                 Config({"BLOCK": block}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))


def test_a_decision_keys_the_call_by_its_own_arguments_not_by_the_autotuners_shared_nargs(tmp_path, monkeypatch):
    """Another thread's `run` sets `nargs` to its own call's arguments while this call decides (made
    here at the moment Triton asks flytune to decide): the call is decided, served and cached by its
    own key, and nothing leaks (before: the other call's key was seeded, and the retry raised flytune's
    internal `Seeded`, reported as the artifact's failure)."""
    bundle(tmp_path, monkeypatch, {100: 64})
    k = make()
    adapter.adopt(k, name="st.add")
    decide = k.prune_configs

    def meddled(kwargs):
        k.nargs = dict(zip(k.arg_names, args_of(50)))   # what another thread's call sets meanwhile
        return decide(kwargs)
    monkeypatch.setattr(k, "prune_configs", meddled)
    assert call(k, 100) == 64 and call(k, 50) == 16
    assert {key[0]: c.kwargs["BLOCK"] for key, c in k.cache.items()} == {100: 64, 50: 16}
    assert ft.stats()["st.add"]["calls"]["offline"] == 1


def test_a_call_made_while_another_thread_reads_the_offline_tier_again_waits_and_is_served_its_artifact(
        tmp_path, monkeypatch):
    """reset_stats (or settings that changed before the first decision) makes the next decision read the
    offline tier again. A call of another thread meanwhile waits for that read and is served its bundled
    config (before: it found the tier cleared, and its key was cached for good with the first config)."""
    bundle(tmp_path, monkeypatch, {200: 64, 1500: 32})
    k = make()
    adapter.adopt(k, name="st.add")
    assert call(k, 200) == 64
    ft.reset_stats()
    reading, release, usable = threading.Event(), threading.Event(), adopted_module._usable

    def slow_read(*a):
        if threading.current_thread() is not threading.main_thread():
            reading.set()
            assert release.wait(60)
        yield from usable(*a)
    monkeypatch.setattr(adopted_module, "_usable", slow_read)
    first = threading.Thread(target=call, args=(k, 1500))
    first.start()
    assert reading.wait(60)   # the first thread is reading the tier again now
    second = threading.Thread(target=call, args=(k, 200))
    second.start()
    second.join(0.5)          # (it waits for the read; before, it decided meanwhile)
    release.set()
    first.join(60)
    second.join(60)
    assert {key[0]: c.kwargs["BLOCK"] for key, c in k.cache.items()} == {1500: 32, 200: 64}
    assert call(k, 200) == 64 and ft.stats()["st.add"]["calls"] == {**ft.stats()["st.add"]["calls"], "offline": 3,
                                                                   "heuristic": 0}


def test_a_searched_winner_is_recorded_as_its_own_keys_config_whatever_best_config_another_call_set(
        tmp_path, monkeypatch):
    """FLYTUNE_AUTOTUNE=1: while a key is searched and launched, another thread's hit sets `best_config`
    (made here by the config's pre_hook, which Triton calls just before the launch): the decision
    announced, counted and emitted as an artifact is the winner Triton's cache holds for the key."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "emit"))
    other = triton.Config({"BLOCK": 999}, num_warps=1)
    k = make(pre_hook=lambda nargs: setattr(k, "best_config", other))
    adapter.adopt(k, name="st.add")
    seen = []
    with ft.on_decision(lambda e: seen.append(e["config"])):
        k[lambda m: (triton.cdiv(777, m["BLOCK"]),)](*args_of(777))
    (winner,) = k.cache.values()
    assert Config.coerce(winner).kwargs["BLOCK"] != 999
    assert [c.kwargs["BLOCK"] for c in seen] == [winner.kwargs["BLOCK"]]
    (art,) = [Artifact.load(p) for p in (tmp_path / "emit").glob("*.json")]
    assert art.config.kwargs["BLOCK"] == winner.kwargs["BLOCK"]


def test_a_seeded_key_taken_out_before_its_retry_read_it_is_decided_again_by_every_tier(tmp_path, monkeypatch):
    """Another thread's reset_stats (or a refused pack) takes the key flytune just seeded out of Triton's
    cache before the call's retry reads it: the call is decided again and served its artifact (before:
    the retry offered only a search, which FLYTUNE_AUTOTUNE=0 forbids, and the call failed)."""
    bundle(tmp_path, monkeypatch, {100: 64})
    k = make()
    adapter.adopt(k, name="st.add")
    decide, taken = k.prune_configs, []

    def then_reset(kwargs):
        try:
            return decide(kwargs)
        except Exception:
            if not taken:
                taken.append(1)
                ft.reset_stats()   # what another thread does meanwhile
            raise
    monkeypatch.setattr(k, "prune_configs", then_reset)
    assert call(k, 100) == 64 and taken
    assert ft.stats()["st.add"]["calls"]["offline"] == 1


def test_a_launch_failing_on_a_keys_first_call_is_tritons_error_unchained():
    """The first call of a key goes through Triton's `run` twice (flytune seeds the key, Triton's retry is
    its hit): a launch failing there raises Triton's error chained to nothing of flytune's; a repeated
    launch keyword is Triton's TypeError (Python 3.11 reports one raised inside a handler as a KeyError)."""
    k = make()
    adapter.adopt(k, name="st.first")
    x, y, out, n = args_of(50)

    def failing(meta):
        raise ZeroDivisionError("the grid failed")
    with pytest.raises(ZeroDivisionError) as e:
        k[failing](x, y, out, n)
    assert e.value.__context__ is None
    k2 = make()
    adapter.adopt(k2, name="st.first2")
    with pytest.raises(TypeError, match="multiple values for keyword argument 'num_warps'") as e:
        k2[(4,)](x, y, out, n, num_warps=4)
    assert e.value.__context__ is None


def test_two_threads_learning_one_layout_at_once_share_the_key_that_won(monkeypatch):
    """A first call (x, out, n) and another passing an optional tensor too (x, out, n, w) learn the
    positional layout at once: the one learnt is one call's, and the other call is not remembered under
    it (before: remembered under a key without its tensor's dtype, so a call with another dtype of `w`
    was a hit launching another Triton key's config)."""
    from flytune_build.runtime.adapters import hit_keys, hits

    configs = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def scale(x, out, n, w=None, HAS_W: tl.constexpr = False, BLOCK: tl.constexpr = 16):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m)
        if HAS_W:
            v = v * tl.load(w + offs, mask=m)
        tl.store(out + offs, v, mask=m)

    adapter.adopt(scale, name="st.race")
    x, out = torch.randn(64), torch.empty(64)
    positional_key, remember = hit_keys._positional_key, hits.Hits.remember
    a_done, b_in, a_launched = threading.Event(), threading.Event(), threading.Event()

    def learning(*a):
        if threading.current_thread().name == "B":
            b_in.set()
            assert a_done.wait(60)   # B found no layout learnt and builds its own while A learns
        return positional_key(*a)

    def remembering(self, *a, **kw):
        if threading.current_thread().name == "A":
            a_launched.set()
            assert b_in.wait(60)
        try:
            return remember(self, *a, **kw)
        finally:
            if threading.current_thread().name == "A":
                a_done.set()
    monkeypatch.setattr(hit_keys, "_positional_key", learning)
    monkeypatch.setattr(hits.Hits, "remember", remembering)

    def b():
        assert a_launched.wait(60)
        scale[(1,)](x, out, 64, torch.randn(64), True)
    threads = [threading.Thread(target=lambda: scale[(1,)](x, out, 64), name="A"), threading.Thread(target=b, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.setattr(hit_keys, "_positional_key", positional_key)
    monkeypatch.setattr(hits.Hits, "remember", remember)
    assert list(scale.flytune_adopted.hits.memo) == [(3, 64, torch.float32, torch.float32)]
    half = (64, "torch.float32", "torch.float32", "torch.float16")
    scale.cache[half] = configs[2]   # Triton's cache holds BLOCK 64 for w in float16 (a key added: the memo stays)
    scale[(1,)](x, out, 64, torch.randn(64).half(), True)
    assert scale.best_config.kwargs["BLOCK"] == 64


def test_two_threads_first_calls_of_one_key_make_one_decision_told_once(tmp_path, monkeypatch):
    """Two threads miss Triton's cache for one key at once (here both inside a slow pruner, if they can
    be): one decides it, the other finds it in the cache; one decision, one event."""
    bundle(tmp_path, monkeypatch, {64: 32})
    inside, events = [], []

    def prune(configs, nargs, **kwargs):
        inside.append(threading.current_thread().name)
        for _ in range(50):   # wait up to 0.5 s for the other thread to come in too
            if len(set(inside)) > 1:
                break
            threading.Event().wait(0.01)
        return configs

    k = triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"],
                        prune_configs_by={"early_config_prune": prune})(make().fn)
    adapter.adopt(k, name="st.add")
    with ft.on_decision(events.append):
        threads = [threading.Thread(target=call, args=(k, 64), name=f"t{i}") for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(events) == 1 and len(k.flytune_adopted._stats.decisions) == 1
    assert ft.stats()["st.add"]["calls"]["offline"] == 2


def test_the_first_config_is_pruned_with_the_calls_own_arguments_whatever_another_thread_set(monkeypatch):
    """FLYTUNE_AUTOTUNE=0, no artifact: the "first" tier asks Triton's pruning, which reads the Autotuner's
    `nargs`; another thread's call sets it meanwhile (made here at the moment Triton asks flytune to
    decide). Each thread reads its own: the pruner is handed this call's arguments (before: the other
    call's, so a key was decided, and cached for good, for another shape: a wrong output)."""
    seen = []

    def prune(configs, nargs, **kwargs):
        seen.append(nargs["n"])
        return [c for c in configs if c.kwargs["BLOCK"] >= nargs["n"]]   # one program must cover n

    k = triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64, 128)], key=["n"],
                        prune_configs_by={"early_config_prune": prune})(make().fn)
    adapter.adopt(k, name="st.prune")
    decide = k.prune_configs

    def meddled(kwargs):
        other = threading.Thread(target=lambda: setattr(k, "nargs", dict(zip(k.arg_names, args_of(16)))))
        other.start()
        other.join()
        return decide(kwargs)
    monkeypatch.setattr(k, "prune_configs", meddled)
    x, y, out, n = args_of(100)
    k[(1,)](x, y, out, n)
    assert seen == [100] and torch.equal(out, x + y) and k.best_config.kwargs["BLOCK"] == 128
    assert type(k).__name__ == "Autotuner" and isinstance(k, triton.runtime.autotuner.Autotuner)
    k.nargs = {"n": 1}
    other = threading.Thread(target=lambda: seen.append(k.nargs))
    other.start()
    other.join()
    assert seen[-1] is None and k.nargs == {"n": 1}


def test_a_reset_during_a_decision_waits_for_it_and_leaves_nothing_of_it_in_tritons_cache(monkeypatch):
    """reset_stats on another thread while a key is being decided (here: held inside the decision's
    fallback warning, shown between the decision being remembered and its config put into Triton's
    cache): the reset waits for the decision, then takes its config out; the next call decides again
    and is told once (before: the config stayed in the cache for good, counted as a search's)."""
    import warnings

    k = make()
    adapter.adopt(k, name="st.reset")
    inside, go, shown = threading.Event(), threading.Event(), warnings.showwarning

    def slow_show(*a, **kw):
        if threading.current_thread().name == "decider":
            inside.set()
            assert go.wait(60)
        return shown(*a, **kw)
    monkeypatch.setattr(warnings, "showwarning", slow_show)
    decider = threading.Thread(target=call, args=(k, 50), name="decider")
    decider.start()
    assert inside.wait(60)
    resetter = threading.Thread(target=ft.reset_stats)
    resetter.start()
    resetter.join(0.5)   # (it waits for the decision; before, it emptied the cache under it)
    go.set()
    decider.join(60)
    resetter.join(60)
    assert dict(k.cache) == {}
    events = []
    with ft.on_decision(events.append):
        call(k, 50)
        call(k, 50)
    assert len(events) == 1 and ft.stats()["st.reset"]["calls"]["heuristic"] == 2
    assert ft.stats()["st.reset"]["calls"]["scratch"] == 0


def test_a_warm_up_priming_a_key_a_first_call_is_deciding_makes_one_decision(tmp_path, monkeypatch):
    """`flytune warmup` primes a key (`prime_key`) while a first call of the same key is deciding it: one
    decides, the other finds it decided; one decision, one event (before: two, each its own config
    object, the one launched not the one left in the cache)."""
    bundle(tmp_path, monkeypatch, {100: 64})
    k = make()
    adapter.adopt(k, name="st.add")
    adopted = k.flytune_adopted
    inside, go, make_config = threading.Event(), threading.Event(), adopted_module.triton_config

    def slow(*a, **kw):   # the call is making the artifact's config object (its decision not yet remembered)
        if threading.current_thread() is threading.main_thread():
            inside.set()
            assert go.wait(60)
        return make_config(*a, **kw)
    monkeypatch.setattr(adopted_module, "triton_config", slow)
    primed = []
    warm = threading.Thread(target=lambda: primed.append(adopted.prime_key(
        {"n": 100, "x": "float32", "y": "float32", "out": "float32"})))
    threading.Timer(0, lambda: (inside.wait(60), warm.start(), warm.join(0.5), go.set())).start()
    events = []
    with ft.on_decision(events.append):
        assert call(k, 100) == 64
        warm.join(60)
        assert call(k, 100) == 64
    assert len(adopted._stats.decisions) == 1 and len(events) == 1 and primed[0] is adopted._stats.decisions[0]
    assert ft.stats()["st.add"]["calls"]["offline"] == 2


def test_a_cache_that_keeps_nothing_launches_the_calls_own_decision_and_never_searches(tmp_path, monkeypatch):
    """A cache of the library's own that drops what is put in it: every retry of the call's decision finds
    nothing; the call launches its own last decision (the artifact) under FLYTUNE_AUTOTUNE=strict (before:
    the last retry offered only a search, and strict raised TierMissError for a key its artifact serves)."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    bundle(tmp_path, monkeypatch, {100: 64})

    class Forgetful(dict):
        def __setitem__(self, key, value):
            pass
    k = make()
    k.cache = Forgetful()
    adapter.adopt(k, name="st.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    assert ft.stats()["st.add"]["calls"]["offline"] == 2 and ft.stats()["st.add"]["calls"]["search"] == 0
    # under 0 with no artifact, each call is decided anew, and the key's one decision serves them all: one
    # decision, told once, nothing kept per call (before: a new one on every retry of every call)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    ft.reset_stats()
    events = []
    with ft.on_decision(events.append):
        for _ in range(5):
            call(k, 50)
    adopted = k.flytune_adopted
    assert len(events) == 1 and len(adopted._stats.decisions) == 1 and len(adopted.objects) == 1
    assert ft.stats()["st.add"]["calls"]["heuristic"] == 5


def test_a_call_failing_in_tritons_run_lets_go_of_its_arguments():
    """Triton's `run` keeps the call's arguments (`nargs`, one per thread) until its end, which a failing
    call never reaches: they are let go of there, so a thread whose call failed holds no tensor after it."""
    import gc
    import weakref

    class Mine(dict):   # a dict of the library's own: every call takes Triton's `run`
        pass
    k = make()
    k.cache = Mine()
    adapter.adopt(k, name="st.fails")
    kept = []

    def failing(meta):
        raise ZeroDivisionError("the grid failed")

    def call_failing():
        x, y, out, n = args_of(50)
        kept.append(weakref.ref(x))
        try:
            k[failing](x, y, out, n)
        except ZeroDivisionError:
            return True
    assert call_failing() and k.nargs is None
    gc.collect()   # (the failed call's traceback holds its frames in a cycle)
    assert kept[0]() is None


def test_two_artifacts_of_one_key_with_different_configs_seed_neither_and_say_so(tmp_path, monkeypatch):
    d = tmp_path / "arts"
    for n, block in ((100, 16), (100.0, 64), (200, 64)):   # 100 and 100.0: one key to Python and to Triton
        Artifact("st.clash", {"n": n, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
                 Config({"BLOCK": block}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
    ft.reset_stats()
    k = make()
    with pytest.warns(ft.FlytuneWarning, match=r"and different configs: neither is served"):
        assert adapter.adopt(k, name="st.clash") == 1   # n=200 alone
    assert call(k, 200) == 64
