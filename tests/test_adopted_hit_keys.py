"""An adopted kernel's hit builds its key inline for its common layouts (one key argument, 1-4 tensors)
and launches with flytune's launch keywords (`hits.launch_keywords`): each tensor's dtype is keyed apart
whatever the layout, and every launch of a config flytune decided (first call, warm-up primed, hit,
keyword call, and `kernel.warmup`'s compiles) passes one set of options in one order, the one the warm-up
readies, so a config flytune serves is one kernel in the JIT's cache; a config Triton's own search put in
its cache is launched with Triton's options, the kernel its search launched. What a hit of Triton's does
a hit keeps: `best_config` whoever set it before, the pre_hook's own error, the call's tensors let go of."""
import pytest
import torch
import triton
import triton.language as tl

from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER
from flytune_build.runtime.adapters import hits
from flytune_build.runtime.serving import autotuner
from flytune_build.runtime.warming import binder

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]


@triton.jit
def _double(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) * 2, mask=m)


@triton.jit
def _copy(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m), mask=m)


@triton.jit
def _add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def _add3(x, y, z, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    s = tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m) + tl.load(z + offs, mask=m)
    tl.store(out + offs, s, mask=m)


@triton.jit
def _add4(x, y, z, w, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    s = tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m) + tl.load(z + offs, mask=m)
    tl.store(out + offs, s + tl.load(w + offs, mask=m), mask=m)


KERNELS = {1: _double, 2: _copy, 3: _add, 4: _add3, 5: _add4}   # tensors -> kernel (5: the general key)


def _tensors(count: int, n: int, half: int | None) -> list:
    """`count` tensors of `n` elements, float32 but the one at `half`, float16."""
    return [torch.randn(n).to(torch.float16 if i == half else torch.float32) for i in range(count)]


def _expected(ts: list) -> torch.Tensor:
    if len(ts) == 1:
        return ts[0].float() * 2
    if len(ts) == 2:
        return ts[0].float()
    return sum(t.float() for t in ts[:-1])


def _call(k, count: int, n: int, half: int | None = None) -> int:
    ts = _tensors(count, n, half)
    before = ts[0].float().clone()
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](*ts, n)
    want = before * 2 if count == 1 else _expected(ts)
    assert torch.allclose(ts[-1].float(), want.to(ts[-1].dtype).float(), atol=1e-2)
    return k.best_config.kwargs["BLOCK"]


def _bundle(tmp_path, monkeypatch, name: str, num_ctas: int = 1) -> None:
    """`name`'s float32 key of n=100 over (x, y, out) bundled: BLOCK 64."""
    Artifact(name, {"n": 100, "x": "float32", "y": "float32", "out": "float32"}, INTERPRETER,
             Config({"BLOCK": 64}, num_warps=1, num_ctas=num_ctas)).save(tmp_path)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path))
    autotuner.reset_stats()


def _bundled(tmp_path, monkeypatch, name: str, configs=CONFIGS):
    """`_add` under `triton.autotune(configs)`, adopted as `name`, its key of n=100 bundled (`_bundle`)."""
    _bundle(tmp_path, monkeypatch, name)
    k = triton.autotune(configs=configs, key=["n"])(_add)
    adapter.adopt(k, name=name)
    return k


@pytest.mark.parametrize("count", sorted(KERNELS))
def test_each_tensors_dtype_is_keyed_apart_whatever_the_layout(count, tmp_path, monkeypatch):
    """All float32 is bundled (BLOCK 64); a call with any one tensor float16 is another Triton key, not
    bundled: its first config (16), decided anew, then a hit of its own; the bundled key's hits stay."""
    import flytune_build as ft

    names = KERNELS[count].arg_names[:count]
    Artifact(f"keys.k{count}", {"n": 100, **dict.fromkeys(names, "float32")}, INTERPRETER,
             Config({"BLOCK": 64}, num_warps=1)).save(tmp_path)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path))
    autotuner.reset_stats()
    k = triton.autotune(configs=CONFIGS, key=["n"])(KERNELS[count])
    adapter.adopt(k, name=f"keys.k{count}")
    assert [_call(k, count, 100) for _ in range(3)] == [64] * 3
    for half in range(count):
        assert _call(k, count, 100, half) == 16 and _call(k, count, 100, half) == 16
        assert _call(k, count, 100) == 64
    s = ft.stats()[f"keys.k{count}"]
    assert s["calls"]["offline"] == 3 + count and s["calls"]["heuristic"] == 2 * count
    assert len(k.flytune_adopted.hits.memo) == 1 + count


def _spied(jit, monkeypatch) -> list:
    """The options (keywords that are no parameter) of every launch of `jit`, in the order passed."""
    launches, run = [], jit.run
    params = set(jit.arg_names)

    def spy(*args, **kwargs):
        launches.append(tuple(n for n in kwargs if n not in params and n not in ("grid", "warmup")))
        return run(*args, **kwargs)
    monkeypatch.setattr(jit, "run", spy)
    return launches


@pytest.mark.parametrize("num_ctas", [1, 2])
def test_every_launch_of_flytunes_passes_the_options_the_warmup_readies(num_ctas, tmp_path, monkeypatch):
    """The first call (seeded, then launched by flytune), a key a warm-up primed, hits and a keyword call
    pass one set of options in one order (`launch_keywords`: no `num_ctas` where it is 1), one of the two
    the warm-up puts into the JIT's cache (`binder.launch_options`): one compile per config."""
    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_ctas=num_ctas) for b in (16, 32, 64)]
    _bundle(tmp_path, monkeypatch, "keys.opts", num_ctas)
    launches, seen = _spied(_add, monkeypatch), []
    for primed in (False, True):
        del launches[:]
        k = triton.autotune(configs=configs, key=["n"])(_add)
        adapter.adopt(k, name="keys.opts")
        if primed:   # `flytune warmup`: the key put into Triton's cache ahead
            assert k.flytune_adopted.prime_key({"n": 100, "x": "float32", "y": "float32", "out": "float32"})
        assert [_call(k, 3, 100) for _ in range(3)] == [64] * 3   # seeded or primed, then hits
        x, y, out = _tensors(3, 100, None)
        k[(4,)](x=x, y=y, out=out, n=100)
        k[(4,)](x=x, y=y, out=out, n=100)   # a hit of its layout
        assert torch.equal(out, x + y)
        seen.append(list(launches))
    want = ("num_warps", "num_stages") if num_ctas == 1 else ("num_warps", "num_ctas", "num_stages")
    assert [set(each) for each in seen] == [{want}] * 2 and [len(each) for each in seen] == [5, 5]
    readied = [tuple(n for n in o if n != "BLOCK") for o in binder.launch_options(Config.coerce(k.best_config))]
    assert want in readied
    assert list(hits.launch_keywords(k.best_config)) == ["BLOCK", *want]


def test_a_warmup_compiles_each_config_with_the_options_the_hits_launch_it_with(tmp_path, monkeypatch):
    """`kernel.warmup(...)` (Triton's Autotuner.warmup, adopted): every pruned config compiled, nothing
    launched, each with the options a hit of flytune's passes and with Triton's own (a config Triton's cache
    holds by another hand launches with those), so the hit after it finds its kernel."""
    k = _bundled(tmp_path, monkeypatch, "keys.warm")
    compiled, params = [], set(_add.arg_names)

    def warmup(*args, **kwargs):
        compiled.append((kwargs["BLOCK"], tuple(n for n in kwargs if n not in params and n != "grid")))
    monkeypatch.setattr(_add, "warmup", warmup, raising=False)
    launches = _spied(_add, monkeypatch)
    x, y, out = _tensors(3, 100, None)
    k.warmup(x, y, out, 100, grid=(1,))
    both = (("num_warps", "num_stages"), ("num_warps", "num_ctas", "num_stages"))   # flytune's set, Triton's
    assert compiled == [(b, o) for b in (16, 32, 64) for o in both] and not launches
    assert _call(k, 3, 100) == 64 and launches == [("num_warps", "num_stages")]


def test_a_seeded_first_call_lets_go_of_its_tensors(tmp_path, monkeypatch):
    """Triton's `run` keeps a call's arguments (`nargs`) until its end, which the first call of a key
    flytune seeds never reaches: flytune lets go of them, so the call's tensors are freed with the call."""
    import gc
    import weakref

    k = _bundled(tmp_path, monkeypatch, "keys.nargs")
    x, y, out = _tensors(3, 100, None)
    k[(2,)](x, y, out, 100)
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None and getattr(k, "nargs", None) is None
    assert _call(k, 3, 100) == 64


def test_best_config_set_by_another_hand_is_the_hits_again_after_it(tmp_path, monkeypatch):
    k = _bundled(tmp_path, monkeypatch, "keys.best")
    assert _call(k, 3, 100) == 64 and _call(k, 3, 100) == 64
    for other in (None, k.configs[0]):
        k.best_config = other   # a harness resetting it, or another config
        assert _call(k, 3, 100) == 64


def test_a_pre_hook_failing_on_a_hit_raises_its_own_error_as_in_triton(tmp_path, monkeypatch):
    """The config's pre_hook runs before the launch, outside its handler: its error is the hook's own,
    chained to nothing, not the artifact's launch-or-fail."""
    calls = []

    def hook(nargs):
        calls.append(nargs["BLOCK"])
        if len(calls) > 1:
            raise ZeroDivisionError("the hook failed")
    configs = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=hook) for b in (16, 32, 64)]
    k = _bundled(tmp_path, monkeypatch, "keys.hook", configs)
    assert _call(k, 3, 100) == 64
    with pytest.raises(ZeroDivisionError, match="the hook failed") as e:
        _call(k, 3, 100)   # a hit
    assert e.value.__context__ is None and e.value.__cause__ is None and calls == [64, 64]


def test_a_pre_hook_failing_on_a_keys_first_call_raises_its_own_error(tmp_path, monkeypatch):
    """The first call of a bundled key (flytune seeds it and launches it) runs the pre_hook outside the
    launch's handler too: the hook's own error, not the artifact's launch-or-fail, and no other tier."""
    from flytune_build.core.errors import ArtifactExecutionError

    def hook(nargs):
        raise ZeroDivisionError("the hook failed")
    configs = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=hook) for b in (16, 32, 64)]
    k = _bundled(tmp_path, monkeypatch, "keys.hook1", configs)
    for primed in (False, True):
        if primed:
            k.cache.clear()
            assert k.flytune_adopted.prime_key({"n": 100, "x": "float32", "y": "float32", "out": "float32"})
        with pytest.raises(ZeroDivisionError, match="the hook failed") as e:
            _call(k, 3, 100)
        assert not isinstance(e.value, ArtifactExecutionError) and e.value.__context__ is None


def test_an_autotuner_keeping_best_config_in_a_property_is_served_by_hits(tmp_path, monkeypatch):
    """A subclass keeping `best_config` elsewhere than its `__dict__` (a property): hits read and write
    it through the attribute, so every call after the first is a hit and `best_config` is the hit's."""
    from triton.runtime.autotuner import Autotuner

    class Kept(Autotuner):
        @property
        def best_config(self):
            return self.__dict__.get("_kept")

        @best_config.setter
        def best_config(self, value):
            self.__dict__["_kept"] = value

    _bundle(tmp_path, monkeypatch, "keys.kept")
    k = Kept(_add, _add.arg_names, CONFIGS, key=["n"], reset_to_zero=None, restore_value=None)
    adapter.adopt(k, name="keys.kept")
    slow = []
    path_slow = hits.Path.slow
    monkeypatch.setattr(hits.Path, "slow", lambda self, *a: slow.append(1) or path_slow(self, *a))
    assert [_call(k, 3, 100) for _ in range(4)] == [64] * 4 and len(slow) == 1
    k.best_config = None
    assert _call(k, 3, 100) == 64 and len(slow) == 1


def test_a_warmup_through_heuristics_compiles_with_the_hits_options(tmp_path, monkeypatch):
    """`@triton.heuristics` over the Autotuner passes `warmup=True` to its `run` (Heuristics has no
    `warmup`): flytune compiles the config its cache holds with the options its hits launch it with."""
    @triton.jit
    def _add_opt(x, y, out, n, HAS_Y: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m)
        if HAS_Y:
            v += tl.load(y + offs, mask=m)
        tl.store(out + offs, v, mask=m)

    _bundle(tmp_path, monkeypatch, "keys.heur")
    tuner = triton.autotune(configs=CONFIGS, key=["n"])(_add_opt)
    k = triton.heuristics({"HAS_Y": lambda a: a["y"] is not None})(tuner)
    adapter.adopt(tuner, name="keys.heur")
    launches = _spied(_add_opt, monkeypatch)
    x, y, out = _tensors(3, 100, None)
    k.warmup(x, y, out, 100, grid=(2,))
    k[(2,)](x, y, out, 100)
    assert torch.equal(out, x + y) and tuner.best_config.kwargs["BLOCK"] == 64
    assert launches == [("num_warps", "num_stages")] * 2   # the compile, then the launch


def test_a_hit_of_a_call_tritons_run_launched_passes_tritons_options(monkeypatch):
    """FLYTUNE_AUTOTUNE=1, a key no artifact serves: Triton's `run` searches it and launches its winner with
    Triton's options (`all_kwargs()`, `num_ctas` too); the hits after it pass those, so they find the
    kernel that launch put into the JIT's cache instead of loading it once more."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    autotuner.reset_stats()
    k = triton.autotune(configs=CONFIGS, key=["n"])(_add)
    adapter.adopt(k, name="keys.searched")
    launches = _spied(_add, monkeypatch)
    winner = _call(k, 3, 100)
    assert k.flytune_adopted.stats()["calls"]["search"] == 1
    tritons = launches[-1]
    assert tritons == ("num_warps", "num_ctas", "num_stages")
    assert [_call(k, 3, 100) for _ in range(2)] == [winner] * 2 and len(k.flytune_adopted.hits.memo) == 1
    assert launches[-2:] == [tritons] * 2
