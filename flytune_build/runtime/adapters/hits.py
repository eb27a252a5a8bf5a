"""An adopted kernel's hits: a call whose key was decided is served without Triton's `Autotuner.run`.

Triton's hit computes its cache key from every argument on every call (about 4.5 us on the stub of
benchmarks/dispatch_overhead.py). Once Triton's `run` has served a call from its cache (flytune put the
config there, or Triton searched it), the call is remembered (`Hits.remember`) under a key at least as
fine as Triton's (`key_of`); the next such call is a lookup in that memo, `best_config` set, the
config's pre_hook called with Triton's arguments, and the launch (`wrapped_run`), counted as Triton's
path counts it. A miss, a search, strict mode and a failing launch take Triton's `run`, unchanged.

Invariants: a hit launches the object Triton's cache held for that call when it was remembered; the
memo is emptied whenever flytune changes Triton's cache (`Adopted.forget`), while `recording` searches,
and when the cache's size changed by any other hand (a user clearing it to re-tune). A kernel whose
Autotuner overrides `run`, keeps its cache in no dict or has one config is never remembered (`refused`
says why: `stats()["dispatch"]`).
"""
from __future__ import annotations

import operator
from collections.abc import Callable

from .. import events

MAX_HITS = 4096   # hit keys remembered per kernel (a key argument holding many values stops here)


class Seeded(Exception):
    """Raised through Triton's `run` by `prune_configs` once it has put the call's config in the cache."""


class Hits:
    """One adopted kernel's memo: hit key -> (config object, decision or None, its kwargs, pre_hook, tier)."""

    def __init__(self, tuner):
        self.tuner = tuner
        self.memo: dict = {}
        self.sized = [-1]                 # len(tuner.cache) when the memo was last added to
        self.refused = refused(tuner)     # None: hits skip Triton's `run`; else why they cannot
        self.key = key_of(tuner)
        self.on = True                    # False while `recording`: every call takes Triton's `run`

    def clear(self) -> None:
        self.memo.clear()

    def remember(self, args, kwargs, obj, d, tier) -> None:
        """Remember a call Triton served from its cache, where this kernel's hits take that path, the call
        can be keyed and the memo is not full."""
        if self.refused is not None or not self.on or len(self.memo) >= MAX_HITS:
            return
        if len(self.tuner.cache) != self.sized[0]:
            self.memo.clear()
            self.sized[0] = len(self.tuner.cache)
        try:
            if self.key.learn(args, kwargs):
                self.memo[self.key(args, kwargs)] = (obj, d, obj.all_kwargs(), getattr(obj, "pre_hook", None), tier)
        except (TypeError, IndexError, AttributeError, ValueError):
            return


def wrapped_run(adopted, original):
    """The adopted Autotuner's `run`: a hit of `adopted.hits`, else Triton's `original` run (`slow`), which
    decides, searches or serves as Triton does, its call remembered where it can be."""
    tuner, seeded, local, memo = adopted.tuner, adopted.seeded, adopted.local, adopted.hits.memo
    launch, key = tuner.fn.run, adopted.hits.key
    positional, parameters, named = key.positional, key.parameters, key.named
    cache, sized = tuner.cache, adopted.hits.sized

    def run(*args, grid=ABSENT, warmup=ABSENT, **kwargs):
        # `grid` and `warmup` apart: what Triton's launch (`kernel[grid](...)`) passes on every call, so the
        # parameter check is skipped where no other keyword came (+0.51 -> +0.45 us over a ported hit on the
        # 2-core CPU, benchmarks/dispatch_overhead.py)
        try:  # `key`, inlined: the hot path
            k = positional[0](args)
            obj, d, meta, hook, tier = memo[named(k, kwargs) if kwargs and not parameters.isdisjoint(kwargs) else k]
            # Triton's cache changed by hand (cleared to re-tune): decide again; a call that is not a launch's
            if len(cache) != sized[0] or warmup is ABSENT or grid is ABSENT:
                raise KeyError
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):  # not decided, or not keyable
            return slow(args, _keywords(grid, warmup, kwargs))
        tuner.best_config = obj
        if hook is not None:
            hook({**dict(zip(tuner.arg_names, args)), **_keywords(grid, warmup, kwargs), **meta})
        try:
            ret = launch(*args, grid=grid, warmup=warmup, **kwargs, **meta)
        except Exception:
            return slow(args, _keywords(grid, warmup, kwargs))  # Triton's path says what failed, and which tier
        if d is None:
            adopted.counts()[tier] += 1
        else:
            d.calls += 1
        return ret

    def slow(args, kwargs):
        try:
            try:
                ret = original(*args, **kwargs)
            except Seeded:  # `prune_configs` put this call's config in Triton's cache: a hit now
                local.retrying = True
                try:
                    ret = original(*args, **kwargs)
                finally:
                    local.retrying = False
        except Exception as e:
            adopted.launch_failed(adopted.failure(args, kwargs, e), e)  # raises, unless a pack's config was refused
            return run(*args, **kwargs)  # decided again: the next tier serves
        obj = tuner.best_config
        d = seeded.get(id(obj))
        tier = None
        if d is None:
            tier = adopted.served(args, kwargs)
        else:
            d.calls += 1
            if d.calls == 1:
                events.announce(adopted.name, d)
        if d is not None or tier is not None:
            adopted.hits.remember(args, kwargs, obj, d, tier)
        return ret
    return run


ABSENT = object()  # a keyword the call did not pass


def _keywords(grid, warmup, kwargs: dict) -> dict:
    """The call's keywords as it passed them."""
    out = {} if grid is ABSENT else {"grid": grid}
    if warmup is not ABSENT:
        out["warmup"] = warmup
    return {**out, **kwargs}


def key_of(tuner):
    """The key of a call in `Hits.memo`, at least as fine as Triton's cache key (the key arguments'
    values and each tensor argument's dtype): the number of positional arguments, the key arguments'
    values and the dtypes of the arguments at the kernel's tensor positions, learnt from the first call
    remembered (`learn`; a call whose tensors lie elsewhere is never remembered, and one with no tensor
    where the first had one raises AttributeError here), then each keyword that names a parameter with
    its dtype or value (`grid`, `warmup` and the launch options are no parameter: Triton keys none of
    them). A position that held None in the first call is keyed by its type too (an optional tensor).
    IndexError where a key argument is not positional or before any call is learnt (never, for a key
    naming no parameter), TypeError or AttributeError where a value cannot be keyed: that call takes
    Triton's `run`.

    Hand-written (indexing unrolled for up to 4 tensors, a getter beyond) over a general key (every
    argument's `getattr(a, "dtype", None)`, which raises inside for each non-tensor): on the 6-argument
    stub of benchmarks/dispatch_overhead.py a general key costs 0.93 us, `map` over an itemgetter 0.45 us,
    the unrolled one 0.18 us."""
    positions = [tuner.arg_names.index(k) for k in tuner.keys if k in tuner.arg_names]
    keyable = len(positions) == len(tuner.keys)  # else a key names no parameter: no call is learnt
    parameters, chosen = frozenset(tuner.arg_names), []

    def hit_key(args, kwargs):
        key = chosen[0](args)   # IndexError: no call learnt yet
        if parameters.isdisjoint(kwargs):
            return key
        return named_key(key, kwargs)

    def named_key(key, kwargs):
        return key, tuple((k, getattr(kwargs[k], "dtype", kwargs[k])) for k in sorted(parameters.intersection(kwargs)))

    def learn(args, kwargs) -> bool:
        """Whether a call's key can be remembered: its tensors (and Nones) lie where the kernel's first did."""
        if not keyable:
            return False
        tensors = tuple(i for i, a in enumerate(args) if hasattr(a, "dtype"))
        nones = tuple(i for i, a in enumerate(args) if a is None)
        if not chosen:
            chosen.append(_positional_key(positions, tensors, nones))
            learn.layout = (len(args), tensors, nones)
        return learn.layout == (len(args), tensors, nones)

    hit_key.learn, hit_key.positional, hit_key.parameters, hit_key.named = learn, chosen, parameters, named_key
    return hit_key


def _positional_key(positions: list, tensors: tuple, nones: tuple) -> Callable[[tuple], tuple]:
    """args -> (how many, the key arguments' values, the dtypes at `tensors`, the types at `nones`);
    unrolled for one key argument and up to 4 tensors (see `key_of`)."""
    if nones or len(tensors) > 4 or len(positions) != 1:
        values, tensor_getter, none_getter = _getter(positions), _getter(tensors), _getter(nones)
        dtype_of = operator.attrgetter("dtype")
        return lambda a: (len(a), values(a), *map(dtype_of, tensor_getter(a)), *map(type, none_getter(a)))
    (p,) = positions
    if not tensors:
        return lambda a: (len(a), a[p])
    if len(tensors) == 1:
        (i,) = tensors
        return lambda a: (len(a), a[p], a[i].dtype)
    if len(tensors) == 2:
        i, j = tensors
        return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype)
    if len(tensors) == 3:
        i, j, k = tensors
        return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype, a[k].dtype)
    i, j, k, m = tensors
    return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype, a[k].dtype, a[m].dtype)


def _getter(positions) -> Callable[[tuple], tuple]:
    """args -> a tuple of the arguments at `positions` (one position: that argument twice, so that the
    getter stays a C itemgetter); IndexError where `args` is shorter."""
    if not positions:
        return lambda args: ()
    return operator.itemgetter(*positions) if len(positions) > 1 else operator.itemgetter(positions[0], positions[0])


def refused(tuner) -> str | None:
    """Why this Autotuner's hits must go through its own `run` (None: they need not)."""
    from triton.runtime.autotuner import Autotuner

    if not isinstance(tuner.cache, dict):
        return f"its cache is a {type(tuner.cache).__name__}, not a dict"
    if type(tuner).run is not Autotuner.run:
        return f"{type(tuner).__name__} overrides Autotuner.run"
    if len(tuner.configs) <= 1:
        return "one config: Triton launches it without a key"
    return None
