"""An adopted `@triton.autotune` kernel's hit skips Triton's `run` (flytune's memo: one key, one lookup,
the launch) and stays what a Triton hit is to its caller: the config a Triton hit would launch for that
call, `best_config`, the config's pre_hook, the counters; a call keyed otherwise is decided anew."""
import pytest
import torch
import triton
import triton.language as tl

from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER
from flytune_build.runtime.serving import autotuner

HOOKED = []


def _hook(nargs):
    HOOKED.append((nargs["n"], nargs["BLOCK"]))


def make(pre_hook=None, do_bench=None):
    configs = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=pre_hook) for b in (16, 32, 64)]

    @triton.autotune(configs=configs, key=["n"], do_bench=do_bench)
    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
    return add


def call(k, n, dtype=torch.float32):
    x, y, out = torch.randn(n).to(dtype), torch.randn(n).to(dtype), torch.empty(n, dtype=dtype)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n)
    assert torch.equal(out, x + y)
    return k.best_config.kwargs["BLOCK"]


@pytest.fixture
def bundled(tmp_path, monkeypatch):
    d = tmp_path / "arts"
    for n, block, dtype in ((100, 64, "float32"), (100, 32, "float16")):
        Artifact("hit.add", {"n": n, "x": dtype, "y": dtype, "out": dtype}, INTERPRETER,
                 Config({"BLOCK": block}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    return d


def test_an_adopted_hit_skips_tritons_run_and_counts_as_before(bundled):
    import flytune_build as ft

    k = make()
    adapter.adopt(k, name="hit.add")
    original = k.flytune_adopted
    assert [call(k, 100) for _ in range(5)] == [64] * 5
    assert len(original.hits.memo) == 1 and ft.stats()["hit.add"]["dispatch"] == "fast"
    s = ft.stats()["hit.add"]
    assert s["calls"]["offline"] == 5 and s["calls"]["heuristic"] == 0


def test_clearing_tritons_cache_by_hand_decides_again_as_a_triton_hit_would(bundled, monkeypatch):
    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    k.cache.clear()   # what a user does to make Triton decide again
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR")   # (the offline tier keeps its seeds: still bundled)
    assert call(k, 100) == 64 and call(k, 100) == 64


def test_a_hit_is_keyed_on_every_tensors_dtype_as_triton_keys_its_cache(bundled):
    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    assert call(k, 100, torch.float16) == 32 and call(k, 100, torch.float16) == 32   # another artifact
    assert call(k, 100) == 64
    assert call(k, 50) == 16   # not bundled: the first config, decided anew


def test_a_hit_runs_the_configs_pre_hook_with_tritons_arguments_and_sets_best_config(bundled):
    k = make(pre_hook=_hook)
    adapter.adopt(k, name="hit.add")
    HOOKED.clear()
    for _ in range(3):
        call(k, 100)
    assert HOOKED == [(100, 64)] * 3 and k.best_config.pre_hook is _hook


def test_reset_forgets_the_hits_and_the_next_call_decides_again(bundled, monkeypatch):
    import flytune_build as ft

    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR")
    ft.reset_stats()
    assert not k.flytune_adopted.hits.memo
    assert call(k, 100) == 16   # nothing bundled any more: the first config
    assert ft.stats()["hit.add"]["calls"]["offline"] == 0


def test_an_optional_tensor_given_where_the_first_call_had_none_is_keyed_apart(tmp_path, monkeypatch):
    configs = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32)]

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def scale(x, bias, out, n, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m) * 2
        if HAS_BIAS:
            v += tl.load(bias + offs, mask=m)
        tl.store(out + offs, v, mask=m)

    d = tmp_path / "arts"
    Artifact("hit.scale", {"n": 64, "x": "float32", "out": "float32"}, INTERPRETER,
             Config({"BLOCK": 32}, num_warps=1)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    adapter.adopt(scale, name="hit.scale")
    x, out, bias = torch.randn(64), torch.empty(64), torch.randn(64)
    for _ in range(2):
        scale[(2,)](x, None, out, 64, False)
        assert scale.best_config.kwargs["BLOCK"] == 32 and torch.equal(out, x * 2)
    scale[(4,)](x, bias, out, 64, True)   # Triton's key has one dtype more: not the bundled one
    assert scale.best_config.kwargs["BLOCK"] == 16 and torch.allclose(out, x * 2 + bias)


def test_an_autotuner_that_overrides_run_keeps_tritons_path_and_says_why(bundled):
    import flytune_build as ft
    from triton.runtime.autotuner import Autotuner

    class Mine(Autotuner):
        def run(self, *args, **kwargs):
            return super().run(*args, **kwargs)

    k = make()
    k.__class__ = Mine
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    assert ft.stats()["hit.add"]["dispatch"] == "Mine overrides Autotuner.run"
    assert not k.flytune_adopted.hits.memo and ft.stats()["hit.add"]["calls"]["offline"] == 2


def test_a_hit_passes_the_launch_and_the_pre_hook_what_tritons_run_passes(bundled):
    """Triton's launch passes `grid` and `warmup` by keyword. The first call takes Triton's `run`, the next
    ones flytune's memo: the pre_hook sees the same arguments in the same order, and `warmup=True` (compile,
    launch nothing) reaches the launcher as Triton's run passes it."""
    seen = []
    k = make(pre_hook=lambda nargs: seen.append(list(nargs)))
    adapter.adopt(k, name="hit.add")
    original = k.flytune_adopted
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    for _ in range(3):
        k[(4,)](x, y, out, 100)
        assert torch.equal(out, x + y) and k.best_config.kwargs["BLOCK"] == 64
    assert len(original.hits.memo) == 1
    assert seen == [["x", "y", "out", "n", "grid", "warmup", "BLOCK", "num_warps", "num_ctas", "num_stages"]] * 3
    fresh = torch.zeros(100)
    k.run(x, y, fresh, 100, grid=(4,), warmup=True)   # compiles, launches nothing
    assert torch.equal(fresh, torch.zeros(100)) and len(seen) == 4


# -- Triton's cache changed by another hand: a hit always launches what the cache holds for its call ----------
def test_a_config_put_over_a_cached_key_by_hand_is_what_the_next_hit_launches(bundled):
    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    (key,) = list(k.cache)
    k.cache[key] = k.configs[1]   # the same size: only the value changed
    assert call(k, 100) == 32 and call(k, 100) == 32 and k.best_config is k.configs[1]


CHANGES = {   # each way a hand changes a key Triton's cache holds: the config the key holds after it
    "set": lambda k, key: k.cache.__setitem__(key, k.configs[1]) or 32,
    "update": lambda k, key: k.cache.update({key: k.configs[1]}) or 32,
    "ior": lambda k, key: k.cache.__ior__({key: k.configs[1]}) and 32,
    "delete": lambda k, key: k.cache.__delitem__(key) or 64,   # decided again: the artifact's
    "pop": lambda k, key: k.cache.pop(key) and 64,
    "popitem": lambda k, key: k.cache.popitem() and 64,
    "clear": lambda k, key: k.cache.clear() or 64,
}


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_call_made_while_the_cache_changes_is_never_remembered_with_the_old_config(bundled, change, when):
    """Another thread's call may land between the change of Triton's cache and the memo told of it (here
    made from inside the telling, `before` or `after` it): whatever it launches, no hit after the change
    launches the config the key held before it."""
    import threading

    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    hits, (key,) = k.flytune_adopted.hits, list(k.cache)
    told, once = hits.invalidate, []

    def invalidate():   # an instance attribute: the cache calls `hits.invalidate()` as any other hand would
        if when == "after":
            told()
        if not once:
            once.append(threading.Thread(target=call, args=(k, 100)))
            once[0].start()
            once[0].join()
        if when == "before":
            told()
    hits.invalidate = invalidate
    holds = CHANGES[change](k, key)
    del hits.invalidate
    assert once, "the change told the memo nothing"
    assert [call(k, 100) for _ in range(3)] == [holds] * 3


def test_a_compile_only_call_through_heuristics_counts_no_call_and_announces_nothing(bundled):
    """`kernel.warmup(...)` through `@triton.heuristics` is Triton's `run` with `warmup=True`: it compiles,
    launches nothing, and is no call of the key's decision (a bare Autotuner's `warmup` counts none either)."""
    import flytune_build as ft

    seen = []
    subscription = ft.on_decision(lambda event: seen.append(event["key"]))

    @triton.jit
    def add(x, y, out, n, EVEN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
    tuner = triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])(add)
    k = triton.heuristics({"EVEN": lambda a: a["n"] % 2 == 0})(tuner)
    adapter.adopt(tuner, name="hit.add")
    x, y, out = torch.randn(100), torch.randn(100), torch.zeros(100)
    for _ in range(3):
        k.warmup(x, y, out, 100, grid=(2,))
    assert torch.equal(out, torch.zeros(100)) and sum(ft.stats()["hit.add"]["calls"].values()) == 0 and not seen
    k[(2,)](x, y, out, 100)
    assert torch.equal(out, x + y) and ft.stats()["hit.add"]["calls"]["offline"] == 1 and len(seen) == 1
    k[(2,)](x, y, out, 100)
    subscription()
    assert ft.stats()["hit.add"]["calls"]["offline"] == 2 and len(seen) == 1


def test_an_adopted_warmup_compiles_what_a_hit_launches_whoever_put_the_config_in_the_cache(bundled, monkeypatch):
    """The JIT keys its in-process cache on the launch's keywords: after `kernel.warmup(...)`, the first
    launch of a config finds a compile made with its very keywords, whether flytune decided it (its tiers)
    or Triton's cache holds it by another hand (a table set by hand, Triton's disk cache), as after
    Triton's own warm-up."""
    k = make()
    jit = type(k.fn)
    options = lambda kw: tuple(n for n in kw if n not in k.fn.arg_names and n not in ("grid", "warmup"))
    compiled, launched = set(), []
    warmup, run = jit.warmup, jit.run
    monkeypatch.setattr(jit, "warmup", lambda self, *a, **kw: compiled.add((kw["BLOCK"], options(kw))))
    monkeypatch.setattr(jit, "run", lambda self, *a, **kw: launched.append((kw["BLOCK"], options(kw)))
                        or run(self, *a, **kw))
    adapter.adopt(k, name="hit.add")
    x = torch.zeros(100)
    k.warmup(x, x, x, 100, grid=(1,))
    assert call(k, 100) == 64 and call(k, 100) == 64   # the artifact's: flytune decided it
    (key,) = list(k.cache)
    k.cache[key] = k.configs[1]   # by another hand
    assert call(k, 100) == 32 and call(k, 100) == 32
    assert launched and set(launched) <= compiled, (launched, compiled)


def test_a_cache_put_in_the_autotuners_place_is_triton_s_to_read_from_then_on(bundled, monkeypatch):
    """A dict put in the Autotuner's place by hand tells the memo nothing: every later call takes Triton's
    `run`, which reads that very dict (a change to it is the next launch), and stats say why."""
    import flytune_build as ft

    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR")
    mine = {}
    k.cache = mine   # another way to make Triton decide again
    assert call(k, 100) == 64 and k.cache is mine   # decided anew (the offline tier keeps its seeds), into it
    (key,) = list(mine)
    mine[key] = k.configs[0]
    assert call(k, 100) == 16 and call(k, 100) == 16 and not k.flytune_adopted.hits.memo
    assert ft.stats()["hit.add"]["dispatch"] == "its cache was replaced by hand after adoption"


def test_two_adopted_kernels_sharing_one_cache_each_launch_what_it_holds(bundled):
    one, two = make(), make()
    adapter.adopt(one, name="hit.one")
    adapter.adopt(two, name="hit.two")
    assert call(one, 100) == 16 and call(two, 100) == 16 and call(two, 100) == 16   # nothing bundled: the first
    two.cache = one.cache   # the first kernel's watched cache: it tells only the first kernel's memo
    (key,) = list(one.cache)
    two.cache[key] = two.configs[1]
    assert call(two, 100) == 32 and call(one, 100) == 32 and call(two, 100) == 32


def test_forcing_a_config_launches_it_whatever_the_memo_or_the_cache_holds(bundled):
    """`verify --execute` forces one config (Triton then launches it reading no cache): neither a
    remembered hit nor a key in Triton's cache (a call's, a warm-up's) launches another one."""
    k = make()
    adapter.adopt(k, name="hit.add")
    adopted = k.flytune_adopted
    assert call(k, 100) == 64 and call(k, 100) == 64 and adopted.hits.memo
    for _ in range(2):
        with adopted.forcing(Config({"BLOCK": 16}, num_warps=1)):
            assert call(k, 100) == 16 and call(k, 100) == 16
        assert call(k, 100) == 64 and call(k, 100) == 64


def test_a_key_decided_for_another_call_leaves_the_remembered_hits(bundled):
    k = make()
    adapter.adopt(k, name="hit.add")
    memo = k.flytune_adopted.hits.memo
    assert call(k, 100) == 64 and call(k, 100) == 64
    first = dict(memo)
    assert call(k, 50) == 16 and call(k, 50) == 16   # a new key in Triton's cache: no key it held changed
    assert len(memo) == 2 and all(memo[key] == entry for key, entry in first.items())


def test_a_call_is_remembered_with_its_own_keys_config_whatever_another_call_set_best_config_to(bundled):
    """`best_config` is one attribute for every caller: a call remembered by what it reads there after its
    launch takes the config of any call made meanwhile (another thread's; here one made from the config's
    pre_hook, which runs in that window, deterministically). Each key keeps its own config."""
    nested = []

    def hook(nargs):
        if nargs["n"] == 100 and not nested:
            nested.append(call(k, 50))   # another key's call sets best_config before this launch returns

    k = make(pre_hook=hook)
    adapter.adopt(k, name="hit.add")
    call(k, 100)   # its outputs checked; `best_config` after it is the nested call's, as in Triton
    assert nested == [16]
    memo = k.flytune_adopted.hits.memo
    assert {key[1]: entry[0].kwargs["BLOCK"] for key, entry in memo.items()} == {100: 64, 50: 16}
    assert call(k, 100) == 64 and call(k, 50) == 16 and call(k, 100) == 64


def test_a_cache_of_another_kind_put_in_its_place_ends_the_hits_and_says_why(bundled):
    import flytune_build as ft

    class Logged(dict):
        pass

    k = make()
    adapter.adopt(k, name="hit.add")
    assert call(k, 100) == 64 and call(k, 100) == 64
    k.cache = Logged({key: k.configs[1] for key in k.cache})   # changes flytune cannot watch
    assert call(k, 100) == 32 and call(k, 100) == 32
    assert not k.flytune_adopted.hits.memo
    assert ft.stats()["hit.add"]["dispatch"] == \
        "its cache is a Logged, a dict of its own whose changes flytune cannot watch"


def test_a_kernel_of_one_config_is_not_decided_ahead_as_triton_reads_no_cache_for_it(bundled):
    @triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1)], key=["n"])
    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    adapter.adopt(add, name="hit.add")
    key = {"n": 100, "x": "float32", "y": "float32", "out": "float32"}   # bundled (BLOCK 64)
    assert add.flytune_adopted.prime_key(key) is None and not add.cache
    assert call(add, 100) == 16


def test_a_key_triton_s_cache_holds_is_served_without_triton_s_run_from_its_first_call(bundled, monkeypatch):
    """A key put into Triton's cache ahead (a warm-up's `prime_key`) or by an earlier call is Triton's hit
    from its first call, made without `Autotuner.run` (Triton's run here would fail the test): the
    config's pre_hook, `best_config`, the launch, the counters."""
    from triton.runtime.autotuner import Autotuner

    import flytune_build as ft

    def not_run(self, *args, **kwargs):
        raise AssertionError("Autotuner.run was called")

    monkeypatch.setattr(Autotuner, "run", not_run)
    k = make(pre_hook=_hook)
    adapter.adopt(k, name="hit.add")
    HOOKED.clear()
    assert k.flytune_adopted.prime_key({"n": 100, "x": "float32", "y": "float32", "out": "float32"}) is not None
    assert [call(k, 100) for _ in range(3)] == [64] * 3 and HOOKED == [(100, 64)] * 3
    assert ft.stats()["hit.add"]["calls"]["offline"] == 3 and len(k.flytune_adopted.hits.memo) == 1


# -- calls passing keywords: a hit too, keyed on what Triton keys -----------------------------------------------
def test_a_call_passing_its_arguments_by_keyword_is_a_hit_keyed_on_what_triton_keys(bundled, monkeypatch):
    """Real libraries (fla, flash-attn's layer norm, Triton's fused attention) pass every argument by
    keyword: such a call is remembered under its layout (how many positional, which keywords in which
    order) and its next calls skip Triton's `run`; another dtype, another layout or another order is a
    key of its own."""
    from triton.runtime.autotuner import Autotuner

    import flytune_build as ft

    k = make(pre_hook=_hook)
    adapter.adopt(k, name="hit.add")

    def by_name(n, dtype=torch.float32, order=("x", "y", "out", "n")):
        x, y, out = torch.randn(n).to(dtype), torch.randn(n).to(dtype), torch.empty(n, dtype=dtype)
        args = {"x": x, "y": y, "out": out, "n": n}
        k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](**{a: args[a] for a in order})
        assert torch.equal(out, x + y)
        return k.best_config.kwargs["BLOCK"]

    assert by_name(100) == 64 and by_name(100, torch.float16) == 32   # decided through Triton's run
    assert by_name(100, order=("out", "n", "x", "y")) == 64 and by_name(50) == 16
    calls = ft.stats()["hit.add"]["calls"]
    HOOKED.clear()

    def not_run(self, *args, **kwargs):
        raise AssertionError("Autotuner.run was called")

    monkeypatch.setattr(Autotuner, "run", not_run)
    assert [by_name(100), by_name(100, torch.float16), by_name(100, order=("out", "n", "x", "y")),
            by_name(50)] == [64, 32, 64, 16]
    assert HOOKED == [(100, 64), (100, 32), (100, 64), (50, 16)]
    after = ft.stats()["hit.add"]["calls"]
    assert after["offline"] == calls["offline"] + 3 and after["heuristic"] == calls["heuristic"] + 1
    assert len(k.flytune_adopted.hits.memo) == 4


def test_a_call_mixing_positions_and_keywords_is_a_hit_of_its_own_layout(bundled):
    k = make()
    adapter.adopt(k, name="hit.add")
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    for _ in range(2):
        k[(2,)](x, y, out=out, n=100)
        assert torch.equal(out, x + y) and k.best_config.kwargs["BLOCK"] == 64
        k[(4,)](x, y, out, 50)
        assert k.best_config.kwargs["BLOCK"] == 16
    assert len(k.flytune_adopted.hits.memo) == 2


# -- a launch that fails: once, as Triton's hit fails ------------------------------------------------------------
def _failing(nargs):
    raise ZeroDivisionError("the grid failed")


@pytest.mark.parametrize("remembered", [True, False], ids=["memo", "cached"])
def test_a_launch_that_fails_raises_tritons_error_once_unchained_its_hook_called_once(remembered, monkeypatch):
    """A launch that fails (here its grid raises, inside Triton's launch) raises that error as Triton's hit
    does: chained to no lookup of flytune's, after one pre_hook call and no second launch, whether the call
    was a hit of the memo or of the key Triton's cache holds."""
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR", raising=False)
    k = make(pre_hook=_hook)
    adapter.adopt(k, name="hit.fails")
    x, y, out = torch.randn(50), torch.randn(50), torch.empty(50)
    for _ in range(2):
        k[(4,)](x, y, out, 50)   # decided: the first config (nothing bundled), then remembered
    assert k.flytune_adopted.hits.memo
    if not remembered:
        k.flytune_adopted.hits.invalidate()   # Triton's cache still holds the key
    HOOKED.clear()
    with pytest.raises(ZeroDivisionError, match="the grid failed") as e:
        k[_failing](x, y, out, 50)
    assert e.value.__context__ is None and e.value.__cause__ is None
    assert HOOKED == [(50, 16)]


def test_a_launch_keyword_the_config_sets_is_tritons_type_error_unchained(monkeypatch):
    """Python reports a repeated keyword raised while another exception is handled as a KeyError (3.11):
    the adopted call raises it where no handler runs, a TypeError as Triton's alone, its hook called once."""
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR", raising=False)
    k = make(pre_hook=_hook)
    adapter.adopt(k, name="hit.fails")
    x, y, out = torch.randn(50), torch.randn(50), torch.empty(50)
    k[(4,)](x, y, out, 50)
    HOOKED.clear()
    with pytest.raises(TypeError, match="multiple values for keyword argument 'num_warps'") as e:
        k[(4,)](x, y, out, 50, num_warps=4)
    assert e.value.__context__ is None and HOOKED == [(50, 16)]
