"""An adopted kernel's hits: a call whose key was decided is served without Triton's `Autotuner.run`.

Triton's hit computes its cache key from every argument on every call (about 4.5 us on the stub of
benchmarks/dispatch_overhead.py). Once Triton's `run` has served a call from its cache (flytune put the
config there, or Triton searched it), the call is remembered (`Hits.remember`) under a key at least as
fine as Triton's (`key_of`); the next such call is a lookup in that memo, `best_config` set, the
config's pre_hook called with Triton's arguments, and the launch (`wrapped_run`), counted as Triton's
path counts it. A miss, a search, strict mode and a failing launch take Triton's `run`, unchanged.

Invariants: a hit launches the object Triton's cache holds for that call. Adoption makes the cache a
`Cache`, a dict that empties the memo when a key it holds changes by any hand (overwritten with another
config, deleted, cleared: a user re-tuning, `Adopted.forget`, `recording`); a key added leaves the memo
as it is. A cache put in its place later (`tuner.cache = {}`, another kernel's) tells nothing: from then
on every call takes Triton's `run` (`stats()["dispatch"]` says why). While `forcing` narrows the
configs to one (Triton then reads no cache) every call takes Triton's `run` too. A call is
remembered with the config Triton's cache holds under the call's own Triton key, never `best_config`
(which another thread's call may have set meanwhile), and only if no key changed since that call
began (`Hits.generation`). A kernel whose Autotuner overrides `run`, keeps its cache in no dict (or a
dict subclass of its own) or has one config is never remembered (`refused` says why:
`stats()["dispatch"]`).
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

from .. import events
from .triton_keys import call_key

MAX_HITS = 4096   # hit keys remembered per kernel (a key argument holding many values stops here)


class Seeded(Exception):
    """Raised through Triton's `run` by `prune_configs` once it has put the call's config in the cache
    under the call's Triton key (`key`), which the call's retry then finds."""

    def __init__(self, key):
        super().__init__(key)
        self.key = key


class Cache(dict):
    """An adopted Autotuner's `cache`: Triton's dict, which tells `hits` when a key it holds changes (see
    the module docstring); reads are the dict's own."""
    __slots__ = ("hits",)

    def __setitem__(self, key, value):
        if dict.get(self, key, value) is not value:
            self.hits.invalidate()
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        self.hits.invalidate()
        dict.__delitem__(self, key)

    def __ior__(self, other):
        self.hits.invalidate()
        return dict.__ior__(self, other)

    def clear(self):
        self.hits.invalidate()
        dict.clear(self)

    def pop(self, *args):
        self.hits.invalidate()
        return dict.pop(self, *args)

    def popitem(self):
        self.hits.invalidate()
        return dict.popitem(self)

    def update(self, *args, **kwargs):
        self.hits.invalidate()
        dict.update(self, *args, **kwargs)

    def __reduce__(self):   # a copy or pickle of the cache is Triton's plain dict
        return dict, (dict(self),)


class Hits:
    """One adopted kernel's memo: hit key -> (config object, decision or None, its kwargs, pre_hook, tier)."""

    def __init__(self, tuner):
        self.tuner = tuner
        self.memo: dict = {}
        self._changes = itertools.count()  # next() is one step under the GIL: no lock a fork could inherit held
        self.generation = next(self._changes)  # changes so far to a key of Triton's cache
        self.refused = refused(tuner)     # None: hits skip Triton's `run`; else why they cannot
        self.key = key_of(tuner)
        self.on = True                    # False while `recording` or `forcing`: every call takes Triton's `run`

    def watch(self) -> None:
        """At adoption: make the Autotuner's cache a `Cache` (a copy of Triton's plain dict, the same
        entries) telling this memo of its changes."""
        if self.refused is None and type(self.tuner.cache) is dict:
            watched = Cache(self.tuner.cache)
            watched.hits = self
            self.tuner.cache = watched
        self.invalidate()

    def replaced(self) -> None:
        """A cache put in the Autotuner's place by another hand (`tuner.cache = {}`, another kernel's):
        its changes are not told here, so no call is a hit from then on (`refused` says why)."""
        cache = self.tuner.cache
        if self.refused is None and not (type(cache) is Cache and cache.hits is self):
            self.refused = refused(self.tuner) or "its cache was replaced by hand after adoption"
        self.invalidate()

    def invalidate(self) -> None:
        self.generation = next(self._changes)
        self.memo.clear()

    def cached(self, args, kwargs):
        """The config Triton's cache holds under this call's Triton key (None: not keyable, or none)."""
        try:
            return self.tuner.cache.get(call_key(self.tuner, args, kwargs))
        except TypeError:
            return None

    def remember(self, args, kwargs, obj, d, tier, generation: int) -> None:
        """Remember a call Triton served from its cache with `obj`, where this kernel's hits take that
        path, the call can be keyed, no key of the cache changed since the call began (`generation`)
        and the memo is not full. No lock: the entry is set, then taken out again if a change came
        meanwhile (a change after the check empties the memo itself)."""
        if obj is None or self.refused is not None or not self.on or len(self.memo) >= MAX_HITS:
            return
        try:
            if not self.key.learn(args, kwargs):
                return
            key, entry = self.key(args, kwargs), (obj, d, {"warmup": False, **obj.all_kwargs()},
                                                  getattr(obj, "pre_hook", None), tier)
        except (TypeError, IndexError, AttributeError, ValueError):
            return
        if generation == self.generation:
            self.memo[key] = entry
            if generation != self.generation:
                self.memo.pop(key, None)


def wrapped_run(adopted, original):
    """The adopted Autotuner's `run`: a hit of `adopted.hits`; else, where Triton's cache holds the call's
    key (a warm-up put it there, or an earlier call), Triton's hit made here without `Autotuner.run`
    (`_launched`: 24 -> 17 us of host time for the first call after a warm-up, dispatch_overhead.py);
    else Triton's `original` run, which decides, searches or serves as Triton does. Either way the call
    is remembered where it can be."""
    tuner, local, hits = adopted.tuner, adopted.local, adopted.hits
    memo, launch, key = hits.memo, tuner.fn.run, hits.key
    positional, parameters, named = key.positional, key.parameters, key.named
    cache = tuner.cache

    def run(*args, grid, warmup=ABSENT, **kwargs):
        # `grid` and `warmup` apart: what Triton's launch (`kernel[grid](...)`) passes on every call, so the
        # parameter check is skipped where no other keyword came (a call without `grid` is Python's
        # TypeError, as Triton's launch raises it). Each test here costs 10-40 ns of a 1.4 us hit
        # (benchmarks/dispatch_overhead.py): the cache tells of its changes (`Cache`), only a cache put in
        # its place is looked for, and only `warmup=False`, a launch, is served here
        try:  # `key`, inlined: the hot path
            if kwargs and not parameters.isdisjoint(kwargs):
                obj, d, meta, hook, tier = memo[named(positional[0](args), kwargs)]
            else:
                obj, d, meta, hook, tier = memo[positional[0](args)]
            if warmup is not False or tuner.cache is not cache:
                raise KeyError
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):  # not decided, or not keyable
            return slow(args, _keywords(grid, warmup, kwargs))
        if tuner.best_config is not obj:   # as Triton's hit sets it; a read costs less than a write
            tuner.best_config = obj
        if hook is not None:   # its arguments in Triton's order (`meta` repeats `warmup`, which keeps its place)
            hook({**dict(zip(tuner.arg_names, args)), "grid": grid, "warmup": False, **kwargs, **meta})
        try:  # `meta`: `warmup=False`, then the config's keywords (Triton's JIT sees them in Triton's order)
            ret = launch(*args, grid=grid, **kwargs, **meta) if kwargs else launch(*args, grid=grid, **meta)
        except Exception:
            return slow(args, _keywords(grid, warmup, kwargs))  # Triton's path says what failed, and which tier
        if d is None:
            adopted.counts()[tier] += 1
        else:
            d.calls += 1
        return ret

    def slow(args, kwargs):
        nonlocal cache
        if tuner.cache is not cache:   # put in its place by another hand: no hit from now on
            hits.replaced()
            cache = tuner.cache
        generation = hits.generation
        keyed = len(tuner.configs) > 1   # else Triton launches its one config, reading no cache
        fast = keyed and hits.refused is None and hits.on and kwargs.get("warmup") is False
        obj = hits.cached(args, kwargs) if fast else None
        if obj is not None:  # Triton's cache holds the call's key (a warm-up's, an earlier call's): its hit,
            ret = _launched(tuner, launch, obj, args, kwargs)  # made here as a memo hit is, without its `run`
            if ret is not MISSED:
                return _served(adopted, args, kwargs, obj, ret, generation)
        try:
            ret = _triton(original, local, args, kwargs)
        except Exception as e:
            adopted.launch_failed(adopted.failure(args, kwargs, e), e)  # raises, unless a pack's config was refused
            return run(*args, **kwargs)  # decided again: the next tier serves
        return _served(adopted, args, kwargs, hits.cached(args, kwargs) if keyed else None, ret, generation)
    return run


def _launched(tuner, launch, obj, args, kwargs):
    """Triton's hit of `obj` for this call, as `Autotuner.run` makes it; MISSED where the launch failed
    (Triton's `run` then says what failed, and which tier)."""
    tuner.best_config = obj
    meta = obj.all_kwargs()
    if getattr(obj, "pre_hook", None) is not None:
        obj.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **meta})
    try:
        return launch(*args, **kwargs, **meta)
    except Exception:
        return MISSED


def _served(adopted, args, kwargs, obj, ret, generation: int):
    """Count a call Triton's cache served with `obj` (one config: None, `best_config` tells), announce a
    decision's first call, remember the call; `ret`."""
    d = adopted.seeded.get(id(adopted.tuner.best_config if obj is None else obj))
    tier = None
    if d is None:
        tier = adopted.served(args, kwargs)
    else:
        d.calls += 1
        if d.calls == 1:
            events.announce(adopted.name, d)
    if d is not None or tier is not None:
        adopted.hits.remember(args, kwargs, obj, d, tier, generation)
    return ret


def _triton(original, local, args, kwargs):
    """Triton's `run` of a call, once more where `prune_configs` seeded its key (a hit then)."""
    try:
        return original(*args, **kwargs)
    except Seeded as retry:
        was, local.retrying = local.retrying, retry.key   # a call nested in a hook is another call
        try:
            return original(*args, **kwargs)
        finally:
            local.retrying = was


ABSENT = object()  # a keyword the call did not pass
MISSED = object()  # a launch that failed: Triton's `run` takes the call


def _keywords(grid, warmup, kwargs: dict) -> dict:
    """The call's keywords as it passed them."""
    return {"grid": grid, **kwargs} if warmup is ABSENT else {"grid": grid, "warmup": warmup, **kwargs}


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
    if type(tuner.cache) not in (dict, Cache):
        return f"its cache is a {type(tuner.cache).__name__}, a dict of its own whose changes flytune cannot watch"
    if type(tuner).run is not Autotuner.run:
        return f"{type(tuner).__name__} overrides Autotuner.run"
    if len(tuner.configs) <= 1:
        return "one config: Triton launches it without a key"
    return None
