"""An adopted `@triton.autotune` kernel: its offline tier, how its calls were served, and what
`flytune verify --deep` asks of every registered kernel. It is a `runtime.serving.kernel.Kernel`: its
preamble, checks, fallback warnings, launch-or-fail and the FLYTUNE_AUTOTUNE rule are a ported
kernel's.

`adopt` installs three instance attributes on the Autotuner, makes its `cache` a `hits.Cache` (Triton's
dict, the same entries, which tells the hits memo of its changes) and its `nargs` one per thread
(`ThreadNargs`: Triton's `run` keeps its call's arguments there for its pruning and hooks to read),
leaving Triton's code as it is:
- `prune_configs`: Triton calls it exactly when a key misses its cache, about to search: the one
  place a key is decided, by the mode's tier order (`Kernel.decide`). Its tiers: offline (the
  call's artifact key, order-free: each tensor's dtype by parameter name, finds the best bundled
  artifact for this device), Triton's own search, and "first" (the first config after pruning).
  A config the tiers chose is put into Triton's cache under the call's key (a fresh copy of the
  declared `triton.Config`, its pre_hook with it) and `run` calls Triton again: a hit, nothing
  timed. A kernel with an `early_config_prune` gets the pruner's config for the call, hook included.
  A search runs with flytune's timers where Triton's cannot time (`triton_search`), is counted and
  announced, and with FLYTUNE_AUTOTUNE=1 and FLYTUNE_EMIT_DIR its winner is saved as an artifact;
- `run`: calls Triton's; a call served by a config flytune chose counts for that tier (its first
  call is announced: FLYTUNE_PRINT_AUTOTUNING, `on_decision`); a failing launch of a bundled config
  is an `ArtifactExecutionError` naming the artifact, never Triton's bare error;
- `warmup`: Triton's, marked so its pruning is not taken for a key's first call.

The object Triton's cache holds under a call's key tells which decision served the call (a hit of
flytune's memo remembered it; a call through Triton's `run` looks it up there). `reset` forgets what
flytune put into Triton's cache: the next call decides again, under the settings of then, and the
offline tier is read again first (so is it when the settings changed between `adopt` at import and the
first call: `core.settings.settle`). An Autotuner whose
cache is no dict is registered but not seeded (one warning): Triton's own tuning serves it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import threading
import weakref
from dataclasses import dataclass

from ...core import serving, settings
from ...core.artifact import Artifact
from ...core.config import Config
from ...core.errors import FlytuneError
from ..searching import bench
from .. import device, events
from ..serving import registry
from ..serving.decision import Decision, Stats
from ..serving.kernel import Kernel, first_candidate
from ..serving.offline import TIER, Index, not_served
from . import hits, triton_search
from .triton_keys import artifact_key, call_key, optional_keys, seed_key

TRITON_SEARCHES = object()  # the search tier's answer: Triton runs its own search for this call
_ADOPTED: weakref.WeakSet = weakref.WeakSet()  # every Adopted: its `deciding` lock re-made in a forked child


def _after_fork() -> None:
    for adopted in list(_ADOPTED):
        adopted.deciding = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)


class Calls(threading.local):
    """What a call of an adopted kernel is doing, per thread (a call on another thread, or one nested in
    a hook, is another call)."""
    call = None       # (args, kwargs) of the call going through Triton's `run` (`nargs` may be shared)
    pending = None    # the key of the search Triton runs for the call
    warming = False   # inside Triton's `warmup`
    recorded = None   # (key, seconds, calls) of the search `recording` ran for the call, until it picks (`recorded`)


@dataclass
class Seed:
    """A bundled artifact for one key, and the `triton.Config` object that serves it once made."""
    artifact: Artifact
    level: str
    origin: str
    obj: object = None
    pack: str | None = None   # the config pack (distribution) it came from; None: the owner's


class Adopted(Kernel):
    """A `@triton.autotune` kernel flytune serves and watches (see the module docstring)."""

    def __init__(self, public, tuner, name: str, validate):
        self.declare(name, tuner.arg_names, tuner.configs, tuner.keys, open_axes=True,
                     optional_axes=optional_keys(tuner))
        self.public, self.tuner, self.validate = public, tuner, validate
        self.offline: dict[tuple, Seed] = {}   # artifact key (items, sorted) -> its best bundled artifact
        self.seeded: dict[int, Decision] = {}  # id(a triton.Config flytune put in Triton's cache) -> decision
        self.firsts: dict[tuple, tuple] = {}   # artifact key (items) -> (object, decision) of the "first" tier
        self.objects: list = []                # those objects, kept alive so their ids stay theirs
        self.searching = triton_search.Patches(tuner)  # the timers that search runs with
        self.local, self._reseed = Calls(), True
        self.hits = hits.Hits(tuner)           # the decided calls' hits, Triton's `run` skipped
        self.stale = False                     # the offline tier is read again (under `deciding`) before a decision
        self.deciding = threading.RLock()      # held while a key is decided, primed, forgotten (re-made in a fork)
        _ADOPTED.add(self)
        # a cache that is no dict (FlagGems' LibTuner: sqlite) cannot be seeded: Triton's own tuning serves it
        self.seedable = isinstance(tuner.cache, dict)

    @property
    def reseed(self) -> bool:
        """False while `recording`: every key is searched then, and no call is a hit of flytune's memo."""
        return self._reseed

    @reseed.setter
    def reseed(self, value: bool) -> None:
        self._reseed = self.hits.on = value
        self.hits.invalidate()

    def counts(self) -> dict:
        """The calls counted per tier for calls Triton's cache served (`Stats.served`)."""
        return self._stats.served

    def stats(self) -> dict:
        """The counters (`Kernel.stats`); `dispatch`: `fast` (flytune's memo), or why Triton's `run` serves hits."""
        return {**super().stats(), "dispatch": self.hits.refused or "fast"}

    @classmethod
    def install(cls, public, tuner, name: str, validate) -> "Adopted":
        """The `Adopted` of `tuner`, made and wired in on first adoption; registered under `name`."""
        adopted = vars(tuner).get("flytune_adopted")
        if adopted is None:
            adopted = cls(public, tuner, name, validate)
            adopted.hits.watch()
            vars(tuner).setdefault("nargs", None)   # as after a call of Triton's (hits never set it)
            per_thread_nargs(adopted)
            tuner.run = hits.wrapped_run(adopted, tuner.run)   # a hit of flytune's memo, or Triton's `run`
            tuner.prune_configs = adopted.wrap_prune(tuner.prune_configs)
            tuner.warmup = hits.wrapped_warmup(adopted, tuner.warmup)
            tuner.flytune_adopted = adopted
        else:
            adopted.public, adopted.validate = public, validate
            if name != adopted.name:  # one kernel, one name: the old name no longer reports it
                registry.unregister(adopted)
                adopted.name = name
                adopted.binding = dataclasses.replace(adopted.binding, kernel=name)
        adopted.enroll()
        return adopted

    def wrap_prune(self, original):
        tuner = self.tuner

        def prune_configs(kwargs):
            if self.local.warming or not self.seedable:
                return original(kwargs)
            _settled(self)
            args = self.local.call[0] if self.local.call is not None else tuple(tuner.nargs.values())
            nargs = dict(zip(tuner.arg_names, args))   # this thread's call (another's may be in `tuner.nargs`)
            key, triton_key = artifact_key(tuner, nargs, kwargs), call_key(tuner, args, kwargs)
            with self.deciding:   # one thread decides a key: one that waited finds it in Triton's cache
                decided = tuner.cache.get(triton_key)
                if decided is not None:
                    raise hits.Seeded(triton_key, decided, self.seeded.get(id(decided)))
                mode = settings.current().autotune if self.reseed else "search"
                chosen: list = []
                tiers = {"search": lambda: self.search(key),
                         "offline": lambda: self.from_offline(_items(key), kwargs, chosen, nargs),
                         "first": lambda: self.first_config(key, lambda: original(kwargs), chosen)}
                d = self.decide(mode, key, tiers, can_search=mode == "search" or triton_search.can_time(tuner))
                if d is TRITON_SEARCHES or not chosen:   # (none chosen: no tier answered, Triton's own)
                    return original(kwargs)
                tuner.cache[triton_key] = chosen[0]
            raise hits.Seeded(triton_key, chosen[0], d)
        return prune_configs

    def search(self, key: dict):
        """The search tier: Triton searches this call, with flytune's timers where it needs them."""
        self.local.pending = key
        self.tuner.bench_time = None  # Triton's benchmark() sets it; left None, its disk cache answered
        if self.reseed:  # `recording` has set the timers itself
            triton_search.timed_as_flytune(self.tuner, self.name, bench.ranking(), self.searching)
        return TRITON_SEARCHES

    def from_offline(self, items: tuple, kwargs: dict, chosen: list, nargs: dict | None = None) -> Decision | None:
        """The offline tier: the best bundled artifact for the call's artifact key (`nargs`: the call's
        positional arguments by name, which a kernel's `early_config_prune` reads)."""
        seed = self.offline.get(items)
        if seed is None:
            return None
        if seed.obj is None:
            seed.obj = _pruned(self, seed, nargs or {}, kwargs) if self.tuner.early_config_prune else \
                triton_config(self, seed.artifact.config)
            if seed.obj is None:
                del self.offline[items]
                return None
        chosen.append(seed.obj)
        d = self.seeded.get(id(seed.obj))
        if d is None:
            d = Decision(seed.artifact.config, "offline", dict(seed.artifact.key), level=seed.level,
                         origin=f"{seed.artifact.filename} ({seed.origin})", pack=seed.pack)
            self.remember(seed.obj, d)
        return d

    def first_config(self, key: dict, pruned, chosen: list) -> Decision:
        """The "first" tier: the first config after pruning (`pruned()`), as Triton launches a single config;
        the key's one decision until forgotten (a cache that kept nothing decides it again: the same one)."""
        known = self.firsts.get(items := _items(key))
        if known is None:
            obj = copy.copy(first_candidate(pruned(), self.configs))  # its own id: this decision's
            known = self.firsts[items] = obj, Decision(Config.coerce(obj), "heuristic", key, first=True)
            self.remember(*known)
        chosen.append(known[0])
        return known[1]

    def prime_key(self, key: dict) -> Decision | None:
        """Decide an artifact key ahead (`flytune warmup`), by the mode's order from the offline tier alone:
        its config goes into Triton's cache under the Triton key of a call passing the key's tensors in
        parameter order (`seed_key`), so that call is a hit there. None, deciding nothing, where no artifact
        serves the key, the mode would search it, the kernel prunes per call (`early_config_prune` sees the
        call's tensors) or its searches are being recorded; a strict mode's miss raises."""
        if not self.seedable or not self.reseed or self.tuner.early_config_prune or len(self.tuner.configs) <= 1:
            return None   # (one config: Triton launches it reading no cache)
        _settled(self)
        triton_key, chosen = seed_key(self.tuner, key), []
        with self.deciding:   # a first call deciding the same key meanwhile: one decision, whichever is first
            if triton_key in self.tuner.cache:  # decided already (a call, or an earlier warm-up)
                return self.seeded.get(id(self.tuner.cache[triton_key]))
            d = self.decide(settings.current().autotune, key,
                            {"offline": lambda: self.from_offline(_items(key), {}, chosen)}, can_search=False)
            if d is not None:
                self.tuner.cache[triton_key] = chosen[0]
            return d

    def remember(self, obj, d: Decision) -> None:
        self.seeded[id(obj)] = d
        self.objects.append(obj)
        self._stats.decisions.append(d)

    def served(self, args: tuple, kwargs: dict, obj=None, launched: bool = True) -> str | None:
        """A call Triton served itself: from its cache (its tier, returned), or with the search it just ran
        (None): `obj`, the config Triton's cache holds under its key (None: `best_config`, one config).
        A compile-only call (`launched` False: `warmup=True`) is counted nowhere; its search is recorded."""
        key, self.local.pending = self.local.pending, None
        if key is None:
            tier = "scratch" if len(self.tuner.configs) > 1 else "heuristic"
            if launched:
                self._stats.served[tier] += 1
            return tier
        self.searching.restore()
        seconds = getattr(self.tuner, "bench_time", None)
        if not self.reseed:   # `recording`: its selection picks the config served, then tells it (`recorded`)
            self.local.recorded = key, seconds, int(launched)
            return None
        config = Config.coerce(winner := self.tuner.best_config if obj is None else obj)
        d = self.searched(config, key, seconds, int(launched))
        s = settings.current()
        if seconds is not None and s.autotune == "search" and s.emit_dir:  # FLYTUNE_AUTOTUNE=1: as a ported kernel
            d.artifact = triton_search.winner_artifact(self.tuner, self.name, bench.ranking(), key, args, kwargs, winner)
            self.emit(d.artifact)
        events.announce(self.name, d)
        return None

    def searched(self, config: Config, key: dict, seconds: float | None, calls: int) -> Decision:
        """The decision of a search Triton ran for `key` (`seconds` None: its disk cache answered), counted."""
        if seconds is not None:
            self._stats.searched(seconds)
        d = Decision(config, "scratch", key, first_tier="search" if seconds is not None else None, calls=calls)
        self._stats.decisions.append(d)
        return d

    def recorded(self, winner) -> None:
        """The search `recording` ran for this thread's call is served by `winner` (flytune's selection over
        Triton's timings): counted and told as that config, and no miss (a tuning run searched it)."""
        found, self.local.recorded = self.local.recorded, None
        if found is not None:
            events.announce(self.name, self.searched(Config.coerce(winner), *found), miss=False)

    def failure(self, args: tuple, kwargs: dict, e: Exception) -> Decision | None:
        """The decision of flytune's that served a failing call, else None (Triton's own: the error stands)."""
        self.local.pending = None
        self.searching.restore()
        if not self.seeded or isinstance(e, FlytuneError):
            return None
        try:
            d = self.seeded.get(id(self.tuner.cache.get(call_key(self.tuner, args, kwargs))))
        except TypeError:  # an unhashable key: Triton failed before any launch
            return None
        return d

    def seed(self) -> int:
        """Read the best artifact per Triton key for this device (the earliest source, then the best
        match level) into the offline tier; returns how many it holds (`_seeded`)."""
        return _seeded(self)

    def forget(self) -> None:
        """Take what flytune put into Triton's cache out of it (after a decision in flight): decided again."""
        with self.deciding:
            cache = self.tuner.cache
            for k in [k for k, v in list(cache.items()) if id(v) in self.seeded] if self.seeded else ():
                del cache[k]
            self.seeded.clear()
            self.objects.clear()
            self.firsts.clear()
            self.hits.invalidate()

    def forget_pack(self, d: Decision) -> None:
        """A refused pack decision: its seed leaves the offline tier, its config Triton's cache."""
        with self.deciding:
            cache = self.tuner.cache
            for items, seed in list(self.offline.items()):
                if seed.obj is not None and self.seeded.get(id(seed.obj)) is d:
                    del self.offline[items]
            for k in [k for k, v in list(cache.items()) if self.seeded.get(id(v)) is d]:
                del cache[k]
            self.hits.invalidate()

    @contextlib.contextmanager
    def forcing(self, config):
        """A context in which every call launches `config` (verify --execute): Triton's own path for a
        kernel with one config, which launches it with its pre_hook and consults no cache."""
        saved, hits_on = self.tuner.configs, self.hits.on
        self.tuner.configs, self.hits.on = [triton_config(self, Config.coerce(config))], False
        self.hits.invalidate()
        try:
            yield
        finally:
            self.tuner.configs, self.hits.on = saved, hits_on
            self.hits.invalidate()

    def rediscover(self) -> None:
        self.stale = True

    def reset(self) -> None:
        """Forget decisions and counters (tests; after changing the environment), once a decision in flight
        ended (`deciding`): the offline tier is read again, under the settings and device of then."""
        with self.deciding:
            self._stats = Stats()
            self.local.pending = None
            self.forget()
            self.stale = True


class ThreadNargs:
    """An adopted Autotuner's `nargs`, one per thread. Triton's `run` sets it when a call begins, and its
    `prune_configs` (the pruner, the `perf_model`) and its hooks read it back: one attribute shared by
    every thread, so a call on another thread (or flytune letting a seeded call's arguments go) changed
    what a pruner deciding this call was handed, and it chose for another call's shape. Per thread, each
    call reads its own, and Triton's code is left as it is."""

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return getattr(obj.__dict__["flytune_nargs"], "value", None)

    def __set__(self, obj, value) -> None:
        obj.__dict__["flytune_nargs"].value = value


_THREADED: dict = {}   # an Autotuner class -> its subclass (one per class, for the process's life)


def per_thread_nargs(adopted: Adopted) -> None:
    """Make the adopted Autotuner's `nargs` per thread (`ThreadNargs`) where flytune decides its keys by
    Triton's pruning (a dict cache, more than one config): its class becomes a subclass of its own (same
    name, same methods) holding that one descriptor. A class that defines `nargs` itself keeps it. (A read
    of the descriptor costs about 0.2 us more than the attribute's: Triton's `run` pays it, a hit never.)"""
    tuner = adopted.tuner
    cls = type(tuner)
    if not adopted.seedable or len(tuner.configs) <= 1 or any("nargs" in vars(c) for c in cls.__mro__):
        return
    local = threading.local()
    local.value = vars(tuner).pop("nargs", None)
    tuner.__dict__["flytune_nargs"] = local
    sub = _THREADED.get(cls)
    if sub is None:
        sub = _THREADED[cls] = type(cls.__name__, (cls,), {"nargs": ThreadNargs(), "__module__": cls.__module__,
                                                           "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    object.__setattr__(tuner, "__class__", sub)   # past a class's own __setattr__


def _seeded(self: Adopted) -> int:
    """`Adopted.seed`: the offline tier read whole, then put in place (a thread deciding meanwhile read the old one)."""
    if not self.seedable:
        self.stale = False
        self.fallback(f"its Autotuner keeps its cache in a {type(self.tuner.cache).__name__}, not a dict: "
                      f"flytune cannot seed it, and Triton's own tuning serves every call")
        return 0
    here, idx, offline = device.current(), Index(), {}
    best: dict[tuple, tuple] = {}
    clashes: dict[tuple, list] = {}   # Triton key -> files of one identity and rank with other configs
    for rank, art, level, origin, pack in _usable(self, here, idx):
        tk = seed_key(self.tuner, art.key)
        if tk not in best or rank < best[tk][0]:
            best[tk] = (rank, art, level, origin, pack)
            clashes.pop(tk, None)
        elif rank == best[tk][0] and art.device == best[tk][1].device and art.config != best[tk][1].config:
            clashes.setdefault(tk, [best[tk][1].filename]).append(art.filename)   # `n = 100`, `n = 100.0`
    for tk, names in clashes.items():
        idx.problems.append(serving.conflict(names, best.pop(tk)[1].key))
    for problem in idx.problems:
        self.fallback(f"artifact ignored: {problem}")
    self.forget()
    for tk, (_, art, level, origin, pack) in best.items():
        if tk not in self.tuner.cache:  # else Triton already decided this key in this process
            offline[_items(art.key)] = Seed(art, level, origin, pack=pack)
    self.offline, self.stale = offline, False   # whole: a thread deciding meanwhile read the old one
    if not best and idx.other_devices:
        self.fallback(f"no artifact matches this device ({here}); bundled for: "
                      f"{', '.join(sorted(idx.other_devices))}")
    return len(offline)


def _usable(self: Adopted, here, idx: Index):
    """(rank, artifact, level, origin, pack) for each artifact of this kernel usable on `here`."""
    for order, src in TIER.ranked(self.name):  # the owner's bundle, then accepted packs (core.serving)
        pack = src.dist if order[0] == serving.PACK else None
        for doc, dev, origin, fname in TIER.documents(src, self.name, idx):
            level = src.served_level(dev, here)
            if level is None:
                idx.other_devices.add(not_served(dev, here))
                continue
            art = None
            try:
                art = Artifact.from_json(doc)
                self.check_key(art.key, fname or art.filename)
                self.check_binds(art.config, set(), "config", file=fname or art.filename)
            except FlytuneError as e:  # a bundle's documents come without a file name: the artifact's own
                self.fallback(f"artifact {fname or getattr(art, 'filename', '?')} from {origin} rejected: {e.rule}")
                continue
            yield serving.rank(order, level), art, level, origin, pack


def _settled(self: Adopted) -> None:
    """Before a key is decided: the process's first decision reads the environment once more, and the
    offline tier is read again where the settings or the device changed since it was (reset_stats, settle)."""
    settings.settle()
    if self.stale:
        with self.deciding:   # one thread reads the tier again; the others wait for it, then decide from it
            if self.stale:
                self.seed()


def _pruned(self: Adopted, seed: Seed, nargs: dict, kwargs: dict):
    """The object serving an artifact of a kernel whose `early_config_prune` may attach pre_hooks: a
    copy of the pruner's config with its data for this call, its pre_hook with it; a fresh one when
    the pruner's configs carry no hook; None (with one warning) when they do and none is the
    artifact's."""
    tuner, config = self.tuner, seed.artifact.config
    made = list(tuner.early_config_prune(tuner.configs, nargs, **kwargs))
    match = next((c for c in made if Config.coerce(c) == config), None)
    if match is None and any(getattr(c, "pre_hook", None) is not None for c in made):
        self.fallback(f"artifact {seed.artifact.filename} ({seed.origin}) rejected: its config is none of the "
                      f"configs early_config_prune makes for this call, which carry pre_hooks (a config "
                      f"never launches without its hook)")
        return None
    return copy.copy(match) if match is not None else triton_config(self, config)


def triton_config(kernel: Adopted, config: Config):
    """A fresh `triton.Config` with `config`'s data: a copy of the kernel's declared one (its pre_hook
    with it) when there is one, else a new one."""
    for obj, c in zip(kernel.declared, kernel.configs):
        if c == config and hasattr(obj, "all_kwargs"):
            return copy.copy(obj)
    import triton

    return triton.Config(dict(config.kwargs), num_warps=config.num_warps, num_stages=config.num_stages,
                         num_ctas=config.num_ctas, maxnreg=config.maxnreg)


def _items(key: dict) -> tuple:
    # a null axis is an absent one (Triton keys nothing for None; earlier releases wrote no null axes)
    return tuple(sorted((k, v) for k, v in key.items() if v is not None))
