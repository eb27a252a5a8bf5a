"""An adopted kernel's hits: a call whose key was decided is served without Triton's `Autotuner.run`.

Triton's hit computes its cache key from every argument on every call (about 4.5 us on the stub of
benchmarks/dispatch_overhead.py). Once Triton's `run` has served a call from its cache (flytune put the
config there, or Triton searched it), the call is remembered (`Hits.remember`) under a key at least as
fine as Triton's (`key_of`); the next such call is a lookup in that memo, `best_config` set, the
config's pre_hook called with Triton's arguments, and the launch (`wrapped_run`), counted as Triton's
path counts it; a call passing keywords is keyed under its layout (fla's and flash-attn's calls pass
every argument by keyword). A miss, a search and strict mode take Triton's `run`, unchanged; a launch
that fails is not launched again: its error is the kernel's launch-or-fail, as from Triton's `run`.

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

    def servable(self, args, kwargs):
        """The config Triton's cache holds for a launch this kernel's hits may serve (None: Triton's `run`
        serves it: one config, hits off or refused, or `warmup` not False)."""
        if len(self.tuner.configs) > 1 and self.refused is None and self.on and kwargs.get("warmup") is False:
            return self.cached(args, kwargs)
        return None

    def cached(self, args, kwargs):
        """The config Triton's cache holds under this call's Triton key (None: not keyable, or none)."""
        try:
            return self.tuner.cache.get(call_key(self.tuner, args, kwargs))
        except TypeError:
            return None

    def remember(self, args, kwargs, obj, meta, d, tier, generation: int) -> None:
        """Remember a call Triton served from its cache with `obj` (`meta`: its launch keywords, None: read
        them here), where this kernel's hits take that path, the call can be keyed, no key of the cache
        changed since the call began (`generation`) and the memo is not full. No lock: the entry is set,
        then taken out again if a change came meanwhile (a change after the check empties the memo itself)."""
        if obj is None or self.refused is not None or not self.on or len(self.memo) >= MAX_HITS:
            return
        try:
            key = self.key(args, kwargs)
            if key is None:
                return
            entry = obj, d, {"warmup": False, **(meta or obj.all_kwargs())}, getattr(obj, "pre_hook", None), tier
        except (TypeError, IndexError, KeyError, AttributeError, ValueError):
            return
        if generation == self.generation:
            self.memo[key] = entry
            if generation != self.generation:
                self.memo.pop(key, None)


def wrapped_run(adopted, original):
    """The adopted Autotuner's `run`: a hit of `adopted.hits`; else, where Triton's cache holds the call's
    key (a warm-up's, an earlier call's), Triton's hit made here without `Autotuner.run`; else Triton's
    `original` run. Either way the call is remembered where it can be. A failed launch is not retried:
    its error is launch-or-fail's (`failed`), raised where no handler runs, as Triton's alone is."""
    tuner, local, hits = adopted.tuner, adopted.local, adopted.hits
    memo, launch, key = hits.memo, tuner.fn.run, hits.key
    positional, layouts = key.positional, key.layouts
    cache = tuner.cache

    def run(*args, grid, warmup=ABSENT, **kwargs):
        # `grid` and `warmup` apart: what Triton's launch passes on every call (without `grid`, Python's
        # TypeError, as Triton's). Each test costs 10-40 ns of a 1.4 us hit (dispatch_overhead.py): the cache
        # tells of its changes (`Cache`), only a cache put in its place is looked for here
        try:  # `key`, inlined: the hot path
            if kwargs:
                layout = (len(args), *kwargs)
                entry = memo[layout, layouts[layout](args, kwargs)]
            else:
                entry = memo[positional[0](args)]
            if warmup is not False or tuner.cache is not cache:
                entry = None
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):  # not decided, or not keyable
            entry = None
        if entry is None:
            return slow(args, _keywords(grid, warmup, kwargs))
        obj, d, meta, hook, tier = entry
        if tuner.best_config is not obj:   # as Triton's hit sets it; a read costs less than a write
            tuner.best_config = obj
        if hook is not None:   # its arguments in Triton's order (`meta` repeats `warmup`, which keeps its place)
            hook({**dict(zip(tuner.arg_names, args)), "grid": grid, "warmup": False, **kwargs, **meta})
        try:  # `meta`: `warmup=False`, then the config's keywords (Triton's JIT sees them in Triton's order)
            ret = launch(*args, grid=grid, **kwargs, **meta) if kwargs else launch(*args, grid=grid, **meta)
        except Exception as e:
            error = e
        else:
            if d is None:
                adopted.counts()[tier] += 1
            else:
                d.calls += 1
            return ret
        return failed(args, _keywords(grid, warmup, kwargs), error)

    def slow(args, kwargs):
        nonlocal cache
        if tuner.cache is not cache:   # put in its place by another hand: no hit from now on
            hits.replaced()
            cache = tuner.cache
        generation, obj = hits.generation, hits.servable(args, kwargs)
        # Triton's cache holds the call's key (a warm-up's, an earlier call's): its hit, made here as a memo hit
        meta = None if obj is None else _hooked(tuner, obj, args, kwargs)  # is, without its `run`
        try:
            ret = launch(*args, **kwargs, **meta) if obj is not None else _triton(original, local, args, kwargs)
        except Exception as e:
            error = e
        else:
            if obj is None and len(tuner.configs) > 1:  # else Triton launches its one config, reading no cache
                obj = hits.cached(args, kwargs)
            return _served(adopted, args, kwargs, obj, meta, ret, generation)
        return failed(args, kwargs, error)

    def failed(args, kwargs, e):
        adopted.launch_failed(adopted.failure(args, kwargs, e), e)  # raises, unless a pack's config was refused
        return run(*args, **kwargs)  # decided again: the next tier serves
    return run


def _hooked(tuner, obj, args, kwargs) -> dict:
    """Triton's hit of `obj` for this call up to its launch, as `Autotuner.run` makes it: `best_config`
    set, the config's pre_hook called; the config's launch keywords."""
    tuner.best_config = obj
    meta = obj.all_kwargs()
    if getattr(obj, "pre_hook", None) is not None:
        obj.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **meta})
    return meta


def _served(adopted, args, kwargs, obj, meta, ret, generation: int):
    """Count a call Triton's cache served with `obj` (one config: None, `best_config` tells), announce a
    decision's first call, remember the call (`meta`: `obj`'s launch keywords, None: not yet read); `ret`."""
    d = adopted.seeded.get(id(adopted.tuner.best_config if obj is None else obj))
    tier = None
    if d is None:
        tier = adopted.served(args, kwargs, obj)
    else:
        d.calls += 1
        if d.calls == 1:
            events.announce(adopted.name, d)
    if d is not None or tier is not None:
        adopted.hits.remember(args, kwargs, obj, meta, d, tier, generation)
    return ret


RETRIES = 3  # Triton's `run` of one call: a seeded key taken out again by another thread is decided anew


def _triton(original, local, args, kwargs):
    """Triton's `run` of a call, again where `prune_configs` seeded its key (a hit then), outside the
    handler (an error of the launch is Triton's alone, chained to nothing of flytune's). A key taken
    out of the cache before the retry read it (another thread's `reset_stats`, a refused pack) is
    decided again, by every tier; the last retry lets Triton search (`local.retrying`), so a cache that
    keeps nothing cannot loop. The call's arguments are this thread's `local.call` meanwhile:
    `prune_configs` keys the call by them, never by the Autotuner's `nargs`, which Triton's `run` on
    another thread sets too."""
    was_call, was, local.call = local.call, local.retrying, (args, kwargs)  # a call in a hook is another call
    try:
        for attempt in range(RETRIES - 1):
            try:
                return original(*args, **kwargs)
            except Seeded as seeded:
                key = seeded.key
            local.retrying = key if attempt == RETRIES - 2 else None
        return original(*args, **kwargs)
    finally:
        local.call, local.retrying = was_call, was


ABSENT = object()  # a keyword the call did not pass


def _keywords(grid, warmup, kwargs: dict) -> dict:
    """The call's keywords as it passed them."""
    return {"grid": grid, **kwargs} if warmup is ABSENT else {"grid": grid, "warmup": warmup, **kwargs}


def key_of(tuner):
    """The key of a call in `Hits.memo`, at least as fine as Triton's cache key (the key arguments'
    values and each tensor argument's dtype, in the order the call passed them). A call's layout is
    how many positional arguments it passed and the names of its keywords, in order (`grid`, `warmup`
    and the launch options are no parameter: Triton keys none of them); each layout's key is learnt
    from its first call remembered (`learn`): the key arguments' values, then the dtypes where that
    call passed tensors, then the types where it passed None (an optional tensor). A call whose
    tensors lie elsewhere than its layout's first call's is never remembered; but one whose scalar (a
    float, an int) stands where its layout's first call had one, and is a tensor or a numpy scalar,
    keys as that call does: a hit then launches the config of a key Triton tells apart by that dtype
    (a known limit: keying every scalar's type costs a hit about a fifth more, or generated code). The key of a call
    passing no keyword is flat: (how many, values, dtypes, types), one layout per kernel (`positional`,
    the hot path); a call passing keywords is keyed (layout, (values, dtypes, types)) (`layouts`).
    IndexError or KeyError where a layout was not learnt, TypeError or AttributeError where a value
    cannot be keyed (a call with no tensor where its layout had one): that call takes Triton's `run`.

    Hand-written (indexing unrolled for up to 4 tensors, a getter beyond) over a general key (every
    argument's `getattr(a, "dtype", None)`, which raises inside for each non-tensor): on the 6-argument
    stub of benchmarks/dispatch_overhead.py a general key costs 0.93 us, `map` over an itemgetter 0.45 us,
    the unrolled one 0.18 us."""
    names = tuner.arg_names
    keyable = all(k in names for k in tuner.keys)  # else a key names no parameter: no call is learnt
    chosen: list = []       # the positional layout's key, once learnt
    layouts: dict = {}      # (how many positional, *keyword names) -> that layout's key of (args, kwargs)

    def learn(args, kwargs):
        """The call's memo key where it can be remembered (its tensors and Nones lie where its layout's
        first did), else None. A layout's key is published once (`list.append`, `dict.setdefault`: one
        step each): threads learning one layout at once all use the one that won."""
        if not keyable:
            return None
        named = _named(kwargs)
        if not named:
            found = (len(args), _where(range(len(args)), args))
            if not chosen:
                new = _positional_key([names.index(k) for k in tuner.keys], *found[1])
                new.found = found
                chosen.append(new)
            key = chosen[0]
            return key(args) if key.found == found else None
        layout = (len(args), *named)
        params = [k for k in named if k in names]
        found = _where(range(len(args)), args), _where(params, kwargs)
        key = layouts.get(layout)
        if key is None:
            if len(layouts) >= MAX_LAYOUTS or len(set(named)) != len(named):
                return None
            key = layouts.setdefault(layout, _layout_key(tuner, len(args), params, *found))
        return (layout, key(args, kwargs)) if key.found == found else None

    learn.positional, learn.layouts = chosen, layouts
    return learn


MAX_LAYOUTS = 64   # keyword layouts learnt per kernel


def _named(kwargs: dict) -> tuple:
    """A call's keywords but `grid` and `warmup` (what Triton's launch passes), in order."""
    return tuple(k for k in kwargs if k != "grid" and k != "warmup")


def _where(places, values) -> tuple:
    """(the places of `values` that hold a tensor, those that hold None): one pass (a call's first
    through Triton's path pays it, remembered)."""
    tensors, nones = [], []
    for i in places:
        v = values[i]
        if v is None:
            nones.append(i)
        elif hasattr(v, "dtype"):
            tensors.append(i)
    return tuple(tensors), tuple(nones)


def _layout_key(tuner, count: int, params: list, positional: tuple, named: tuple):
    """(args, kwargs) -> (key values, dtypes, types) for calls of one keyword layout: `count`
    positional arguments, `params` the parameters passed by keyword; `positional` and `named` are
    (tensor places, None places) of its first call. A key argument passed neither way is left out, as
    Triton leaves it out. The keywords' values are read into one tuple after the positional ones, and
    that tuple keyed as positions are (`_places_key`): 0.57 us for the key alone on the stub of
    dispatch_overhead.py, all six arguments by keyword, where a getter and a `map` per part cost 1.32 us
    (timed alone with `timeit` on the 2-core dev machine; the script's keyword line times the whole hit)."""
    index = {n: i for i, n in enumerate(tuner.arg_names)}
    place = {**{i: i for i in range(count)}, **{index[p]: count + j for j, p in enumerate(params)}}
    values = [place[index[k]] for k in tuner.keys if index[k] in place]
    tensors = positional[0] + tuple(count + params.index(p) for p in named[0])
    nones = positional[1] + tuple(count + params.index(p) for p in named[1])
    inner, passed = _places_key(values, tensors, nones), _getter(params)

    def key(a, k):
        return inner((*a, *passed(k)))
    key.found = positional, named
    return key


def _places_key(values: list, tensors: tuple, nones: tuple) -> Callable[[tuple], tuple]:
    """c -> (the values at `values`, the dtypes at `tensors`, the types at `nones`), unrolled for up to
    4 tensors and no None."""
    v = _getter(values)
    if nones or len(tensors) > 4:
        tensor_getter, none_getter, dtype_of = _getter(tensors), _getter(nones), operator.attrgetter("dtype")
        return lambda c: (v(c), *map(dtype_of, tensor_getter(c)), *map(type, none_getter(c)))
    if not tensors:
        return v
    if len(tensors) == 1:
        (i,) = tensors
        return lambda c: (v(c), c[i].dtype)
    if len(tensors) == 2:
        i, j = tensors
        return lambda c: (v(c), c[i].dtype, c[j].dtype)
    if len(tensors) == 3:
        i, j, k = tensors
        return lambda c: (v(c), c[i].dtype, c[j].dtype, c[k].dtype)
    i, j, k, m = tensors
    return lambda c: (v(c), c[i].dtype, c[j].dtype, c[k].dtype, c[m].dtype)


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
    """args (or kwargs) -> a tuple of the values at `positions` (indexes or names; one: that value
    twice, so that the getter stays a C itemgetter); IndexError (KeyError) where one is missing."""
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
