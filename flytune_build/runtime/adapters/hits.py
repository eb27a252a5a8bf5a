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
`stats()["dispatch"]`). Every launch and compile flytune decides passes one keyword set per config
(`launch_keywords`), a config Triton's own `run` put in its cache Triton's; a config's pre_hook is
called outside the launch's handler, so its error is its own, as in Triton's hit; a call flytune seeded
lets go of the arguments Triton's `run` kept (`nargs`).

Known limits: an entry keeps what it read when it was remembered: a `triton.Config` changed in place
afterwards (its kwargs, its pre_hook) launches as it was, and the JIT function's `run` replaced on its
class afterwards (instrumentation) is not called by hits; put a new config in the cache instead, which
the memo is told of.
"""
from __future__ import annotations

import itertools

from .. import events
from .hit_keys import key_of
from .triton_keys import call_key

MAX_HITS = 4096   # hit keys remembered per kernel (a key argument holding many values stops here)


class Seeded(Exception):
    """Raised through Triton's `run` by `prune_configs` once the call's key is decided: the config (`obj`)
    is in the cache under the call's Triton key (`key`), which the call's retry then finds; `decision`,
    flytune's decision of it (None: Triton's own)."""

    def __init__(self, key, obj, decision=None):
        super().__init__(key)
        self.obj, self.decision = obj, decision


class Cache(dict):
    """An adopted Autotuner's `cache`: Triton's dict, which tells `hits` when a key it holds changes (see
    the module docstring); reads are the dict's own. Each change is made first and told after (a call
    that read the old config began before the change, so its generation is stale when it is remembered;
    told first, a call between the telling and the change would remember the old config for good)."""
    __slots__ = ("hits",)

    def __setitem__(self, key, value):
        changed = dict.get(self, key, value) is not value
        dict.__setitem__(self, key, value)
        if changed:
            self.hits.invalidate()

    def __delitem__(self, key):
        dict.__delitem__(self, key)
        self.hits.invalidate()

    def __ior__(self, other):
        try:
            return dict.__ior__(self, other)
        finally:
            self.hits.invalidate()

    def clear(self):
        dict.clear(self)
        self.hits.invalidate()

    def pop(self, *args):
        try:
            return dict.pop(self, *args)
        finally:
            self.hits.invalidate()

    def popitem(self):
        item = dict.popitem(self)
        self.hits.invalidate()
        return item

    def update(self, *args, **kwargs):
        try:
            dict.update(self, *args, **kwargs)
        finally:
            self.hits.invalidate()

    def __reduce__(self):   # a copy or pickle of the cache is Triton's plain dict
        return dict, (dict(self),)


class Hits:
    """One adopted kernel's memo: hit key -> (config object, its launch keywords, the JIT's `run` as it was
    then, its decision, None) for a config without pre_hook that flytune decided (the hot path's entry),
    else (config object, launch keywords, JIT `run`, decision or None, (its pre_hook's call (`_hook`) or
    None, the tier that counts it)): `Path.launched` serves those."""

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
        """The config Triton's cache holds for a launch this kernel's hits may serve, or a compile
        (`warmup=True`, as `@triton.heuristics` passes its `warmup`) they may make (None: Triton's `run`
        serves it: one config, hits off or refused, or no `warmup` passed)."""
        if len(self.tuner.configs) > 1 and self.refused is None and self.on and kwargs.get("warmup") in (False, True):
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
            hook = _hook(self.tuner, obj)
            entry = (obj, {"warmup": False, **(meta or launch_keywords(obj, d is not None))}, self.tuner.fn.run, d,
                     None if hook is None and d is not None else (hook, tier))
        except (TypeError, IndexError, KeyError, AttributeError, ValueError):
            return
        if generation == self.generation:
            self.memo[key] = entry
            if generation != self.generation:
                self.memo.pop(key, None)


def wrapped_run(adopted, original):
    """The adopted Autotuner's `run`: a hit of `adopted.hits`, else `Path` (a call passing keywords, a
    miss). The Autotuner's attributes are read where they are kept (`_attributes`)."""
    tuner, hits = adopted.tuner, adopted.hits
    memo, positional, attributes = hits.memo, hits.key.positional, _attributes(tuner)
    cache = tuner.cache
    shape = p = i = j = k = m = None   # the positional layout's key inlined, once learnt (`publish`)

    def publish(positions: list, tensors: tuple, nones: tuple) -> None:
        """The positional layout's key was learnt: where it is one key argument and 1-4 tensors, `run`
        builds it inline as `_positional_key` does (a call less: 60 ns of a 1.6 us hit, timed alone on
        the 2-core dev machine); `shape` is set last, so a thread that reads it finds the places set."""
        nonlocal shape, p, i, j, k, m
        if len(positions) == 1 and not nones and 1 <= len(tensors) <= 4:
            p, (i, j, k, m) = positions[0], (*tensors, None, None, None)[:4]
            shape = len(tensors)

    def run(*args, grid, warmup=ABSENT, **kwargs):
        # `grid` and `warmup` apart: what Triton's launch passes on every call (without `grid`, Python's
        # TypeError, as Triton's). The hot path, every test on it measured (dispatch_overhead.py): the
        # cache tells of its changes (`Cache`), only a cache put in its place is looked for here
        if kwargs:
            return path.keywords(args, grid, warmup, kwargs)
        try:
            if shape == 3:   # `key`, inlined (`publish`)
                entry = memo[len(args), args[p], args[i].dtype, args[j].dtype, args[k].dtype]
            elif shape == 2:
                entry = memo[len(args), args[p], args[i].dtype, args[j].dtype]
            elif shape == 1:
                entry = memo[len(args), args[p], args[i].dtype]
            elif shape == 4:
                entry = memo[len(args), args[p], args[i].dtype, args[j].dtype, args[k].dtype, args[m].dtype]
            else:
                entry = memo[positional[0](args)]
            obj, meta, launch, d, odd = entry
            if warmup is not False or attributes["cache"] is not cache:
                obj = None
            elif attributes["best_config"] is not obj:   # as Triton's hit sets it (a read costs less than a write)
                tuner.best_config = obj
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):  # not decided, or not keyable
            obj = None   # served outside the handler: its errors are not "during handling of" this one
        if obj is None:
            return path.slow(args, _keywords(grid, warmup, kwargs))
        if odd is not None:   # a pre_hook, or a call counted by its tier
            return path.launched(args, grid, warmup, kwargs, entry)
        try:  # `meta`: `warmup=False`, then the config's `launch_keywords`
            ret = launch(*args, grid=grid, **meta)
        except Exception as e:
            error = e
        else:
            d.calls += 1
            return ret
        return path.failed(args, _keywords(grid, warmup, kwargs), error)

    hits.key.published = publish
    path = Path(adopted, original, run)
    return run


class Path:
    """An adopted kernel's calls that are no positional hit: a call passing keywords (a hit of its
    layout, `key_of`), else a miss: where Triton's cache holds the call's key (a warm-up's, an earlier
    call's), Triton's hit made here without `Autotuner.run`; else Triton's `original` run. Either way the
    call is remembered where it can be. A failed launch is not retried: its error is launch-or-fail's
    (`failed`), raised where no handler runs, as Triton's alone is."""

    def __init__(self, adopted, original, run):
        self.adopted, self.original, self.run = adopted, original, run
        self.tuner, self.hits = adopted.tuner, adopted.hits
        self.memo, self.layouts = self.hits.memo, self.hits.key.layouts
        self.cache = self.tuner.cache   # the cache adopted (until another is put in its place)

    def keywords(self, args, grid, warmup, kwargs):
        """A call passing keywords: keyed under its layout (`key_of`), else `slow`."""
        tuner = self.tuner
        try:
            layout = (len(args), *kwargs)
            entry = self.memo[layout, self.layouts[layout](args, kwargs)]
            if warmup is not False or tuner.cache is not self.cache:
                entry = None
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):
            entry = None
        if entry is None:
            return self.slow(args, _keywords(grid, warmup, kwargs))
        tuner.best_config = entry[0]
        return self.launched(args, grid, warmup, kwargs, entry)

    def launched(self, args, grid, warmup, kwargs, entry):
        """A hit of `entry` (`Hits`) launched, its `best_config` set: the config's pre_hook first, outside
        the launch's handler (its error is its own), then the launch, counted."""
        obj, meta, launch, d, odd = entry
        hook, tier = odd or (None, None)
        if hook is not None:
            hook(args, grid, kwargs)
        try:
            ret = launch(*args, grid=grid, **kwargs, **meta)
        except Exception as e:
            error = e
        else:
            if d is None:
                self.adopted.counts()[tier] += 1
            else:
                d.calls += 1
            return ret
        return self.failed(args, _keywords(grid, warmup, kwargs), error)

    def slow(self, args, kwargs):
        """A miss of the memo: served by Triton's cache here, or by Triton's `run`; remembered."""
        tuner, hits = self.tuner, self.hits
        if tuner.cache is not self.cache:   # put in its place by another hand: no hit from now on
            hits.replaced()
            self.cache = tuner.cache
        generation, obj, meta, error = hits.generation, hits.servable(args, kwargs), None, None
        decided = None
        if obj is None:   # Triton's `run`; where it seeds the call's key, that key's hit is made here
            try:
                ret, obj, decided = _triton(tuner, self.original, self.adopted.local, args, kwargs, hits.servable)
            except Exception as e:
                error = e
        if obj is not None and error is None:
            # Triton's cache holds the call's key (a warm-up's, an earlier call's, just seeded): its hit made
            # here, as a memo hit is, the pre_hook outside the launch's handler
            meta = _hooked(tuner, obj, args, kwargs, id(obj) in self.adopted.seeded)
            try:
                ret = tuner.fn.run(*args, **kwargs, **meta)
            except Exception as e:
                error = e
        if error is None:
            if obj is None and len(tuner.configs) > 1:  # else Triton launches its one config, reading no cache
                obj = hits.cached(args, kwargs)
            return _served(self.adopted, args, kwargs, obj, meta, ret, generation, decided)
        return self.failed(args, kwargs, error)

    def failed(self, args, kwargs, e):
        adopted = self.adopted
        adopted.launch_failed(adopted.failure(args, kwargs, e), e, args, kwargs)  # raises, unless a pack's was refused
        return self.run(*args, **kwargs)  # decided again: the next tier serves


def wrapped_warmup(adopted, original):
    """The adopted Autotuner's `warmup`: Triton's (`Autotuner.warmup`: every pruned config compiled,
    nothing launched), each config compiled with both keyword sets a hit may launch it with
    (`launch_keywords`: flytune's where flytune decides the config, Triton's where Triton's own `run`
    put it in the cache; the JIT keys its in-process cache on them; the second is a hit of Triton's
    disk cache), so a hit after it finds its kernel whoever decides it, as after Triton's own warm-up;
    Triton's own where hits cannot serve the kernel (Triton's `run` launches it) or its Autotuner
    overrides `warmup`. Its pruning is Triton's own (`adopted.local.warming`: nothing is decided)."""
    from triton.runtime.autotuner import Autotuner

    tuner, local = adopted.tuner, adopted.local
    own = type(tuner).warmup is Autotuner.warmup

    def warmup(*args, **kwargs):
        was, local.warming = local.warming, True
        try:
            if not own or adopted.hits.refused is not None:
                return original(*args, **kwargs)
            tuner.nargs = dict(zip(tuner.arg_names, args))
            ret = []
            for c in tuner.prune_configs(kwargs):
                ours, theirs = launch_keywords(c), launch_keywords(c, False)
                ret.append(tuner.fn.warmup(*args, **kwargs, **ours))
                if theirs != ours:   # Triton's set too (see the docstring)
                    tuner.fn.warmup(*args, **kwargs, **theirs)
            tuner.nargs = None
            return ret
        finally:
            local.warming = was
    return warmup


def launch_keywords(obj, ours: bool = True) -> dict:
    """The keywords flytune launches a `triton.Config` with: `all_kwargs()` (the kernel's own, then every
    compiler option set, in Triton's order); for a config flytune decided (`ours`: its tiers, a warm-up)
    less `num_ctas` where it is 1, every backend's default, as a `flytune_build.Config` launches
    (`Config.launch_kwargs`): one keyword less on the hot path (0.1 us of a 1.8 us hit on the 2-core dev
    machine). The JIT keys its in-process cache on the options passed, so every launch of a config
    flytune decided passes these (`_hooked`, the memo's), and the warm-up readies this key as well as
    Triton's (`warming.binder.launch_options`); a config Triton's own `run` put in its cache (its search,
    its disk cache) is launched with Triton's keywords, so its hits find the kernel Triton's own launch
    put in the JIT's cache and never load it once more."""
    meta = obj.all_kwargs()
    if ours and meta.get("num_ctas") == 1:
        del meta["num_ctas"]
    return meta


def _hook(tuner, obj):
    """None, or for a config with a pre_hook: (args, grid, kwargs) -> that hook called with Triton's
    arguments in Triton's order (the positional ones by name, `grid`, `warmup`, the call's keywords, the
    config's `all_kwargs()`), as a hit of Triton's calls it."""
    hook = getattr(obj, "pre_hook", None)
    if hook is None:
        return None
    names, full = tuner.arg_names, obj.all_kwargs()

    def call(args, grid, kwargs):
        hook({**dict(zip(names, args)), "grid": grid, "warmup": False, **kwargs, **full})
    return call


def _hooked(tuner, obj, args, kwargs, ours: bool) -> dict:
    """Triton's hit of `obj` for this call up to its launch, as `Autotuner.run` makes it: `best_config`
    set, the config's pre_hook called with Triton's arguments; the keywords to launch it with
    (`launch_keywords`; `ours`: flytune decided it)."""
    tuner.best_config = obj
    if getattr(obj, "pre_hook", None) is not None:
        obj.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **obj.all_kwargs()})
    return launch_keywords(obj, ours)


def _served(adopted, args, kwargs, obj, meta, ret, generation: int, decided=None):
    """Count a call Triton's cache served with `obj` (one config: None, `best_config` tells), announce a
    decision's first call (a compile-only call, `warmup=True`, counts, announces and remembers none),
    remember the call (`meta`: `obj`'s launch keywords, None: not yet read); `ret`. `decided`: the
    decision this call's own retry was served (`_triton`), which a reset since (another thread's) has
    forgotten: the call counts for it, which the reset's counters do not hold, never as Triton's own."""
    d = adopted.seeded.get(id(adopted.tuner.best_config if obj is None else obj)) or decided
    launched = kwargs.get("warmup") is not True   # a compile-only call (`warmup=True`) serves no call
    tier = None
    if d is None:
        tier = adopted.served(args, kwargs, obj, launched)
    elif launched:
        d.calls += 1
        if d.calls == 1:
            events.announce(adopted.name, d)
    if launched and (d is not None or tier is not None):   # (a hit after it is the key's first call, announced)
        adopted.hits.remember(args, kwargs, obj, meta, d, tier, generation)
    return ret


RETRIES = 3  # Triton's `run` of one call: a seeded key taken out again by another thread is decided anew


def _triton(tuner, original, local, args, kwargs, servable):
    """Triton's `run` of a call: (what it returned, None, None); or, where `prune_configs` seeded the call's
    key and `servable` finds it in Triton's cache, (None, the config it holds, its decision), which the caller
    launches (`_hooked`: the launch keywords of flytune's hits). A seeded key that is not servable (hits
    off or refused) is Triton's `run` again, a hit there, outside the handler (an error of the launch
    is Triton's alone, chained to nothing of flytune's). A key taken out of the cache before it was
    read (another thread's `reset_stats`, a refused pack) is decided again, by every tier in the mode's
    order; taken out every time (a cache that keeps nothing), the call launches its own last decision:
    it never loops, and never searches where the mode does not. The call's arguments are this thread's
    `local.call` meanwhile: `prune_configs` keys the call by them, never by the Autotuner's `nargs`."""
    was_call, local.call = local.call, (args, kwargs)  # a call in a hook is another call
    try:
        for _ in range(RETRIES):
            try:
                return original(*args, **kwargs), None, None
            except Seeded as seeded:
                last = seeded
            finally:   # seeded or failed, Triton's `run` never let go of the call's arguments
                _drop_nargs(tuner, args)
            obj = servable(args, kwargs)
            if obj is not None:
                return None, obj, last.decision if obj is last.obj else None
        return None, last.obj, last.decision
    finally:
        local.call = was_call


class _Read:
    """An Autotuner's attributes read as `__dict__` items (`_attributes`)."""
    __slots__ = ("tuner",)

    def __init__(self, tuner):
        self.tuner = tuner

    def __getitem__(self, name):
        return getattr(self.tuner, name)


def _attributes(tuner):
    """Where a hit reads the Autotuner's `cache` and `best_config`: its `__dict__` (20 ns a read timed alone, where
    the attribute costs 28 ns: its class defines `run`, so CPython does not specialise the read), or,
    for a class that keeps either elsewhere (a property, its own `__getattribute__`, `__getattr__` or
    `__setattr__`), reads of the attributes themselves."""
    cls = type(tuner)
    odd = (cls.__getattribute__ is not object.__getattribute__ or cls.__setattr__ is not object.__setattr__
           or hasattr(cls, "__getattr__") or any(n in vars(c) for c in cls.__mro__ for n in ("cache", "best_config")))
    return _Read(tuner) if odd else tuner.__dict__


def _drop_nargs(tuner, args: tuple) -> None:
    """Triton's `run` keeps the call's arguments (`nargs`) until its end, which a seeded or failed call's
    never reaches: let go of them (its tensors) where they are still this call's."""
    nargs = tuner.nargs
    if nargs is not None and len(nargs) == len(args) and all(a is b for a, b in zip(nargs.values(), args)):
        tuner.nargs = None


ABSENT = object()  # a keyword the call did not pass


def _keywords(grid, warmup, kwargs: dict) -> dict:
    """The call's keywords as it passed them."""
    return {"grid": grid, **kwargs} if warmup is ABSENT else {"grid": grid, "warmup": warmup, **kwargs}


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
