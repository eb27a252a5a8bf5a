"""An adopted `@triton.autotune` kernel: its seeded artifacts, how its calls were served, and what
`flytune verify --deep` asks of every registered kernel.

`adopt` installs three instance attributes on the Autotuner, leaving Triton's code as it is:
- `run`: calls Triton's; a call served by a seeded config counts for the offline tier (its first
  call is announced: FLYTUNE_PRINT_AUTOTUNING, `on_decision`); a failing launch of a seeded config is
  an `ArtifactExecutionError` naming the artifact, never Triton's bare error;
- `prune_configs`: Triton calls it exactly when it is about to search a key. A call whose artifact
  key (order-free: each tensor's dtype by parameter name) has a seeded config, but whose Triton key
  was not seeded (tensors passed as keywords in another order than the parameters'), seeds that key
  and has `run` call Triton again: a hit, nothing timed. FLYTUNE_AUTOTUNE=strict raises
  `TierMissError` there, before anything is timed; otherwise the search is counted and announced.
  A kernel with an `early_config_prune` is seeded there too, on each key's first call: the pruner may
  attach a pre_hook to the configs it returns, and the seeded config is the pruner's, hook included;
- `warmup`: Triton's, marked so its pruning is not taken for a search.

Each seeded config is a fresh copy of the declared `triton.Config` with the artifact's data (its
pre_hook with it): the object Triton reports as `best_config` tells which artifact served a call,
with no key computed on the hot path.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading

from ...core import settings
from ...core.artifact import Artifact, kernel_name
from ...core.codec import Fields
from ...core.config import Config, space_hash
from ...core.errors import DeclarationError, FlytuneError
from ...core.target import LEVELS, match_level
from .. import device, events, callbacks, registry, warning
from ..binding import Binding
from ..decision import Decision, Stats, failure, miss
from ..offline import TIER, Index
from .triton_keys import artifact_key, call_key, optional_keys, seed_key


class Adopted:
    """A `@triton.autotune` kernel flytune seeded and watches (see the module docstring)."""

    def __init__(self, public, tuner, name: str, validate):
        kernel_name(name, Fields(name, DeclarationError), "name")
        self.public, self.tuner, self.name, self.validate = public, tuner, name, validate
        self.arg_names = list(tuner.arg_names)
        self.declared = list(tuner.configs)
        self.configs = [Config.coerce(c) for c in self.declared]
        self.tuned_kwargs = {k: type(v) for c in self.configs for k, v in c.kwargs.items()}
        self.hooks = callbacks.ConfigHooks(self.arg_names, self.declared, self.configs)
        self.binding = Binding(name, tuple(self.arg_names), tuple(tuner.keys), self.tuned_kwargs,
                               self.hooks.declared, open_axes=True, optional_axes=optional_keys(tuner))
        self.space_hash = space_hash(self.configs)
        self.seeded: dict[int, Decision] = {}  # id(seeded triton.Config) -> the decision it stands for
        self.objects: list = []                # the seeded objects, kept alive so their ids stay theirs
        self.pending: dict | None = None       # the key of the search Triton is running for this call
        self.by_key: dict[tuple, object] = {}  # artifact key (items, sorted) -> the seeded object
        self.deferred: dict[tuple, tuple] = {}  # artifact key -> (config, decision), seeded on the first call
        self.local = threading.local()         # .retrying: this thread's `run` calls Triton again after seeding
        self.reseed = True                     # False while `recording`: every key is searched then
        self.warming = False
        self._stats = Stats()

    @classmethod
    def install(cls, public, tuner, name: str, validate) -> "Adopted":
        """The `Adopted` of `tuner`, made and wired in on first adoption; registered under `name`."""
        adopted = vars(tuner).get("flytune_adopted")
        if adopted is None:
            adopted = cls(public, tuner, name, validate)
            tuner.run = adopted.wrap_run(tuner.run)
            tuner.prune_configs = adopted.wrap_prune(tuner.prune_configs)
            tuner.warmup = adopted.wrap_warmup(tuner.warmup)
            tuner.flytune_adopted = adopted
        else:
            adopted.public, adopted.validate = public, validate
            if name != adopted.name:  # one kernel, one name: the old name no longer reports it
                registry.unregister(adopted)
                adopted.name = name
                adopted.binding = dataclasses.replace(adopted.binding, kernel=name)
        registry.register(adopted)
        return adopted

    def wrap_run(self, original):
        tuner, seeded, announce, local = self.tuner, self.seeded, events.announce, self.local

        def run(*args, **kwargs):
            try:
                try:
                    ret = original(*args, **kwargs)
                except _Seeded:  # `prune_configs` seeded this call's key: Triton serves it now
                    local.retrying = True
                    try:
                        ret = original(*args, **kwargs)
                    finally:
                        local.retrying = False
            except Exception as e:
                err = self.failure(args, kwargs, e)
                if err is None:
                    raise
                raise err from e
            d = seeded.get(id(tuner.best_config))
            if d is None:
                self.served()
            else:
                d.calls += 1
                if d.calls == 1:
                    announce(self.name, d)
            return ret
        return run

    def wrap_prune(self, original):
        tuner = self.tuner

        def prune_configs(kwargs):
            if not self.warming:
                key = artifact_key(tuner, tuner.nargs, kwargs)
                seeded = self.by_key.get(_items(key)) if self.reseed and not self._retrying() else None
                if seeded is None and self.reseed and not self._retrying() and _items(key) in self.deferred:
                    seeded = self.pruned(_items(key), kwargs)
                if seeded is not None:
                    tuner.cache[call_key(tuner, tuple(tuner.nargs.values()), kwargs)] = seeded
                    raise _Seeded
                if settings.current().autotune == "strict":
                    raise miss(self.name, key, device.current(), "a search")
                self.pending = key
                tuner.bench_time = None  # Triton's benchmark() sets it; left None, its disk cache answered
            return original(kwargs)
        return prune_configs

    def _retrying(self) -> bool:
        return getattr(self.local, "retrying", False)

    def pruned(self, items: tuple, kwargs: dict):
        """The seeded object for a deferred artifact (a kernel whose `early_config_prune` may attach
        pre_hooks): a copy of the pruner's config with its data for this call, its pre_hook with it; a
        fresh one when the pruner's configs carry no hook; None (with one warning: Triton searches) when
        they do and none is the artifact's."""
        tuner = self.tuner
        config, d = self.deferred.pop(items)
        made = list(tuner.early_config_prune(tuner.configs, tuner.nargs, **kwargs))
        match = next((c for c in made if Config.coerce(c) == config), None)
        if match is None and any(getattr(c, "pre_hook", None) is not None for c in made):
            self._fallback(f"artifact {d.origin} rejected: its config is none of the configs early_config_prune "
                           f"makes for this call, which carry pre_hooks (a config never launches without its hook)")
            return None
        obj = copy.copy(match) if match is not None else self.triton_config(config)
        self.seeded[id(obj)] = d
        self.objects.append(obj)
        self.by_key[items] = obj
        return obj

    def wrap_warmup(self, original):
        def warmup(*args, **kwargs):
            self.warming = True
            try:
                return original(*args, **kwargs)
            finally:
                self.warming = False
        return warmup

    def served(self) -> None:
        """A call Triton served itself: from its cache, or with the search it just ran for a new key."""
        key, self.pending = self.pending, None
        if key is None:
            self._stats.served["scratch" if len(self.tuner.configs) > 1 else "heuristic"] += 1
            return
        seconds = getattr(self.tuner, "bench_time", None)
        config = Config.coerce(self.tuner.best_config)
        if seconds is None:  # Triton's disk cache (cache_results) answered: a winner searched here before
            d = Decision(config, "scratch", key, calls=1)
        else:
            self._stats.searched(seconds)
            d = Decision(config, "scratch", key, first_tier="search", calls=1)
        self._stats.decisions.append(d)
        events.announce(self.name, d)

    def failure(self, args: tuple, kwargs: dict, e: Exception):
        """The `ArtifactExecutionError` for a call a seeded config served, else None (the error stands)."""
        self.pending = None
        if not self.seeded or isinstance(e, FlytuneError):
            return None
        try:
            d = self.seeded.get(id(self.tuner.cache.get(call_key(self.tuner, args, kwargs))))
        except TypeError:  # an unhashable key: Triton failed before any launch
            return None
        return None if d is None else failure(d, e)

    def seed(self) -> int:
        """Seed the Autotuner's cache with the best artifact per Triton key for this device (the earliest
        source, then the best match level); returns how many were seeded."""
        cache = self.tuner.cache
        for k in [k for k, v in cache.items() if id(v) in self.seeded]:
            del cache[k]  # an earlier adoption's seeds: the bundles may have changed
        self.seeded.clear()
        self.objects.clear()
        self.by_key.clear()
        self.deferred.clear()
        pruner = getattr(self.tuner, "early_config_prune", None) is not None
        here, idx = device.current(), Index()
        best: dict[tuple, tuple] = {}
        for rank, art, level, origin in self._usable(here, idx):
            tk = seed_key(self.tuner, art.key)
            if tk not in best or rank < best[tk][0]:
                best[tk] = (rank, art, level, origin)
        for problem in idx.problems:
            self._fallback(f"artifact ignored: {problem}")
        for tk, (_, art, level, origin) in best.items():
            if tk in cache:
                continue  # Triton already decided this key in this process
            d = Decision(art.config, "offline", dict(art.key), level=level, origin=f"{art.filename} ({origin})")
            self._stats.decisions.append(d)
            if pruner:  # the pruner may attach a pre_hook for the call: seeded on the call's first miss
                self.deferred[_items(art.key)] = (art.config, d)
                continue
            obj = self.triton_config(art.config)
            cache[tk] = obj
            self.by_key[_items(art.key)] = obj
            self.seeded[id(obj)] = d
            self.objects.append(obj)
        if not best and idx.other_devices:
            self._fallback(f"no artifact matches this device ({here}); bundled for: "
                           f"{', '.join(sorted(idx.other_devices))}")
        return len(self.seeded) + len(self.deferred)

    def _usable(self, here, idx: Index):
        """(rank, artifact, level, origin) for each artifact of this kernel usable on `here`."""
        for order, src in enumerate(TIER.sources()):
            for doc, dev, accept, origin, fname in TIER.documents(src, self.name, idx):
                level = match_level(dev, here)
                if level is None or level not in accept:
                    idx.other_devices.add(dev.spec() if level is None else f"{dev.spec()} ({level} not accepted)")
                    continue
                try:
                    art = Artifact.from_json(doc)
                    self.check_key(art.key, fname or art.filename)
                    self.check_binds(art.config, set(), "config", file=fname or art.filename)
                except FlytuneError as e:
                    self._fallback(f"artifact {fname or '?'} from {origin} rejected: {e.rule}")
                    continue
                yield (order, LEVELS.index(level)), art, level, origin

    def triton_config(self, config: Config):
        """A fresh `triton.Config` with `config`'s data: a copy of the declared one (its pre_hook with
        it) when there is one, else a new one."""
        for obj, c in zip(self.declared, self.configs):
            if c == config and hasattr(obj, "all_kwargs"):
                return copy.copy(obj)
        import triton

        return triton.Config(dict(config.kwargs), num_warps=config.num_warps, num_stages=config.num_stages,
                             num_ctas=config.num_ctas, maxnreg=config.maxnreg)

    def _fallback(self, reason: str) -> None:
        self._stats.fallback(reason)
        warning.once((self.name, reason), f"flytune: kernel {self.name}: {reason}")

    # -- what every registered kernel offers (`runtime.registry`) ----------------------------------------
    def check_key(self, key, file) -> None:
        self.binding.check_key(key, file)

    def check_binds(self, config: Config, caller: set, what: str, file=None) -> None:
        self.binding.check(config, caller, what, file)

    @contextlib.contextmanager
    def forcing(self, config):
        """A context in which every call launches `config` (verify --execute): Triton's own path for a
        kernel with one config, which launches it with its pre_hook and consults no cache."""
        saved = self.tuner.configs
        self.tuner.configs = [self.triton_config(Config.coerce(config))]
        try:
            yield
        finally:
            self.tuner.configs = saved

    def stats(self) -> dict:
        return self._stats.render()

    def reset(self) -> None:
        self._stats = Stats()
        self.pending = None
        for d in [*self.seeded.values(), *(d for _, d in self.deferred.values())]:
            d.calls = 0
            self._stats.decisions.append(d)


class _Seeded(Exception):
    """Raised through Triton's `run` by `prune_configs` once it has seeded the call's key."""


def _items(key: dict) -> tuple:
    return tuple(sorted(key.items()))
