"""`flytune_build.autotune`: Triton's decorator API with tiers scratch -> offline -> heuristic -> search.

The hot path (`Autotuned.run`, one closure built at decoration time) is: build the key tuple from
positions fixed at decoration time, one dict lookup, launch (after the launched config's pre_hook,
where it has one: `callbacks`). Everything else happens once per distinct key, in `_decide`: the
tiers in the order FLYTUNE_AUTOTUNE's mode gives (`kernel.ORDER`, the rule adopted kernels follow
too), then the decision is counted (`decision`), printed when asked and told to
`events.on_decision` subscribers (`events.announce`). The search itself is `search`; what a winner
depends on and how it was found, `identity`; what a config may bind, `binding`. Kernels register
in `registry`, beside adopted `@triton.autotune` kernels.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ...core import key as keys
from ...core import settings
from ...core.artifact import Artifact
from ...core.codec import Fields, did_you_mean
from ...core.config import Config
from ...core.errors import ArtifactError, DeclarationError, FlytuneError
from ..warming import binder
from .. import callbacks, device, events, identity, warning
from ..searching import search
from . import registry
from .decision import TIERS, Decision, Flights, Stats
from .kernel import Kernel, first_candidate, launch_error
from .offline import TIER, Slot
from .scratch import ScratchCache
from ..wrapping import chain

__all__ = ["TIERS", "Autotuned", "Decision", "autotune", "kernel", "kernels", "reset_stats", "stats"]

WARMUP, REP = 25, 100  # ms of warm-up and timing per candidate when the decorator does not say (Triton's)


def autotune(configs: Sequence[Any], key: Sequence[Any], prune_configs_by: dict | None = None,
             reset_to_zero: Sequence[str] | None = None, restore_value: Sequence[str] | None = None,
             pre_hook: Callable | None = None, post_hook: Callable | None = None, warmup: float | None = None,
             rep: float | None = None, use_cuda_graph: bool = False, do_bench: Callable | None = None,
             cache_results: bool = False, *, default: Callable[[dict], Any] | None = None, name: str | None = None,
             validate: Callable[..., Any] | None = None):
    """Decorate a `@triton.jit` function; call it as `kernel[grid](*args, **kwargs)` like Triton.

    Triton's arguments come first, in Triton's order and with Triton's meaning (docs/reference.md says
    what each does here). Then flytune's: `default(bound_args) -> config` is the zero-search heuristic
    tier; `name` (default `<module>.<function>`) is the kernel name in artifacts; `validate(key)` is an
    optional reference check used by `flytune verify --execute`.
    """
    def decorator(fn):
        return Autotuned(fn, configs, key, default=default, prune_configs_by=prune_configs_by,
                         reset_to_zero=reset_to_zero, restore_value=restore_value, warmup=warmup, rep=rep,
                         do_bench=do_bench, name=name, validate=validate, pre_hook=pre_hook, post_hook=post_hook,
                         use_cuda_graph=use_cuda_graph, cache_results=cache_results)
    return decorator


class Autotuned(Kernel):
    """A kernel under `@autotune`: `kernel[grid](*args)` launches the config its key's tier chose."""

    def __init__(self, fn, configs, key, *, default=None, prune_configs_by=None, reset_to_zero=None,
                 restore_value=None, warmup=None, rep=None, do_bench=None, name=None, validate=None, pre_hook=None,
                 post_hook=None, use_cuda_graph=False, cache_results=False):
        if not callable(getattr(fn, "run", None)):  # `@triton.jit` above `@autotune`: the function is not jitted yet
            what = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
            raise DeclarationError("is not a @triton.jit kernel: put @autotune outside, above "
                                   "@triton.jit, as @triton.autotune goes", file=name or what)
        self.fn = fn
        self._launch = fn.run
        self.base_fn = base = _unwrap(fn)
        arg_names = list(getattr(fn, "arg_names", None) or inspect.signature(base).parameters)
        name = name or f"{base.__module__}.{base.__name__}"
        self.axes = keys.parse_axes(key, arg_names, name)
        self.axis_names = tuple(a.name for a in self.axes)
        # as in Triton, no configs means one default config; pre_hooks stay in `hooks`
        self.declare(name, arg_names, list(configs) or [Config()], self.axis_names)
        self._key = keys.getter([self.arg_names.index(a) for a in self.axis_names])
        self.reset_to_zero = _parameters(reset_to_zero, self.arg_names, self.name, "reset_to_zero")
        self.restore_value = _parameters(restore_value, self.arg_names, self.name, "restore_value")
        for c in self.configs:
            self.check_binds(c, set(), "configs")
        self.default, self.validate = default, validate
        self.prune_configs_by = prune_configs_by or {}
        self.interpreted = type(fn).__module__.endswith("interpreter")
        self.num_warmups, self.num_reps = WARMUP if warmup is None else warmup, REP if rep is None else rep  # Triton's
        self.do_bench = callbacks.timer(do_bench, use_cuda_graph, self.num_reps, self.interpreted)
        self.search_hooks = (pre_hook, post_hook)
        self.cache_results = cache_results  # Triton's disk cache: the scratch tier keeps every winner anyway
        self._memo: dict[tuple, Decision] = {}
        self._flights = Flights(self._memo)  # the keys being decided, the open `forcing` blocks (a miss's)
        self._index = Slot()
        self._scratch = ScratchCache(self.name)
        self.run = self._hot_path()
        self.enroll()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def _hot_path(self):
        """`run`, as a closure over what it needs, built once: a hit is a tuple build, one dict lookup,
        the decision's launcher (`_launcher`: the config's pre_hook, where it has one, then the launch)."""
        memo, key, decide, keywords, failed = self._memo, self._key, self._decide, self._run_keywords, \
            self.launch_failed

        def run(*args, grid, **kwargs):
            if kwargs:
                return keywords(args, kwargs, grid, kwargs.pop("warmup", False))
            try:
                d = memo[key(args)]
            except LookupError:
                d = None  # decided outside the handler: its errors are not "during handling of" the miss
            if d is None:
                d = decide(args, {}, grid)
            d.calls += 1
            try:
                return d.run(*args, grid=grid, **d.launch)  # the launcher, or the pre_hook then the launcher
            except Exception as e:
                d.calls -= 1  # a launch that failed served no call (the tier that serves it instead counts it)
                failed(d, e, args)  # raises, unless a config pack's config was refused: the next tier serves
                return run(*args, grid=grid)
        return run

    def warmup(self, *args, grid, **kwargs) -> list:
        """Compile without launching, as `triton.autotune`'s `warmup` (dtypes may stand for tensors): the
        config a call would be served, else, where only a search could decide, every candidate; nothing
        is timed or searched. Returns what `JITFunction.warmup` returns, one per config compiled."""
        args = _positional(self.arg_names, args, kwargs)
        d = self._known(args, kwargs)
        if d is None:
            d = self._decide(args, kwargs, grid, search=False)
        return compile_only(self, args, kwargs, grid, d)

    def prime(self, *args, **kwargs) -> Decision | None:
        """Decide a call's key from the scratch and offline tiers alone and remember it, launching and
        searching nothing, so that call's first launch is a hit (`runtime.warming.warmup`; stand-ins may take
        the tensors' place). None, remembering nothing, where neither tier serves the key or where the
        decision may depend on more than the key: a scratch cache for this kernel (keyed on tensor
        layouts too), an `early_config_prune` that reads anything but the key's scalar arguments and
        its tensors' dtypes (`search.prunes_by`: it sees the call's tensors), or a callback deciding it
        that fails on the stand-ins. Either way the offline index is loaded here, not at the first call."""
        self.offline_index()   # loaded ahead, and the scratch cache's path found (platformdirs' import)
        if os.path.lexists(self._scratch.path):
            return None
        args = _positional(self.arg_names, args, kwargs)
        if "early_config_prune" in self.prune_configs_by:
            bound = {**dict(zip(self.arg_names, args)), **kwargs}
            tensors = [a for a in self.axis_names if hasattr(bound.get(a), "dtype")]   # keyed on their dtype
            if not search.prunes_by(self, bound, kwargs, [a for a in self.axis_names if a not in tensors], tensors):
                return None
        try:
            return self._known(args, kwargs) or self._decide(args, kwargs, None, search=False, stored_only=True)
        except FlytuneError:
            raise
        except Exception:  # noqa: BLE001 - a callback that cannot read a stand-in: the first call decides
            return None

    def _run_keywords(self, args, kwargs, grid, warmup):
        if warmup:  # `kernel[grid](..., warmup=True)`: Triton's compile-only launch
            compiled = self.warmup(*args, grid=grid, **kwargs)
            return compiled[0] if len(compiled) == 1 else compiled
        args = _positional(self.arg_names, args, kwargs)
        d = self._known(args, kwargs)
        if d is None:
            d = self._decide(args, kwargs, grid)
        d.calls += 1
        try:
            if d.hook is not None:
                d.hook(args, kwargs)
            return self._launch(*args, grid=grid, **kwargs, **d.launch)
        except Exception as e:
            d.calls -= 1  # as on the hot path: a failed launch served no call
            self.launch_failed(d, e, args, kwargs)  # raises, unless a pack's config was refused: the next tier serves
            return self._run_keywords(args, kwargs, grid, False)

    def _known(self, args, kwargs) -> Decision | None:
        try:
            return self._memo[_raw_key(self, args, kwargs)]
        except LookupError:  # not decided yet, or a key parameter missing (deciding says which)
            return None

    def _decide(self, args, kwargs, grid, search: bool = True, stored_only: bool = False) -> Decision | None:
        """The call's decision by the mode's tier order (`kernel.order`), remembered; without `search`,
        None where only a search could decide (nothing remembered). One thread decides a key; a later
        caller of it waits for that decision (`decision.Flights`: the miss path's, never a hit's)."""
        settings.settle()  # the process's first decision reads the environment once more (`kernel.rediscover`)
        if self._flights.forced is not None:
            return self._flights.forced
        bound = dict(zip(self.arg_names, args))
        bound.update(kwargs)
        missing = [a for a in self.axis_names if a not in bound]
        if missing:
            raise DeclarationError(f"key parameter(s) {', '.join(missing)} were not passed", file=self.name,
                                   field="key")
        raw = keys.raw_key(bound, self.axis_names)
        while True:
            d, flight = self._flights.enter(raw)
            if flight is None:
                return d  # forced, or decided by another thread meanwhile
            try:
                d = self._choose(args, kwargs, bound, raw, grid, search, stored_only)
            finally:
                d, new = self._flights.leave(flight, d, lambda: self._stats.decisions)
            if d is not None or not new:
                break  # else forcing or a reset came while deciding: that decision is not stored, decide again
        if d is not None and new:
            events.announce(self.name, d)
        return d

    def _choose(self, args, kwargs, bound, raw, grid, search, stored_only) -> Decision | None:
        """The decision of the first tier of the mode's order that serves the call (nothing stored)."""
        index = self.offline_index()
        key = {a.name: keys.bucket(keys.scalar(v), a, index.tuned(a.name, self.axis_names) if a.mode == "nearest"
                                   else None) for a, v in zip(self.axes, raw)}
        mode = settings.current().autotune
        tiers = {"scratch": lambda: _from_scratch(self, bound, key, kwargs),
                 "offline": lambda: self._from_offline(bound, key, index, kwargs),
                 "first": lambda: self._first_config(bound, kwargs, key)}
        if self.default is not None:
            tiers["heuristic"] = lambda: self._from_default(bound, key)
        if search:  # FLYTUNE_AUTOTUNE=1 and `flytune tune` emit every winner
            tiers["search"] = lambda: _from_search(self, args, kwargs, bound, key, grid, emit=mode == "search")
        if stored_only:  # `prime`: what was tuned or searched before, never a guess from stand-ins
            tiers = {t: tiers[t] for t in ("scratch", "offline")}
        d = self.decide(mode, key, tiers)
        if d is not None:
            if d.hook is None and self.hooks:
                d.hook = self.hooks.bind(d.config)
            d.run = _launcher(self._launch, d.hook)
        return d

    def offline_index(self):
        """This kernel's offline index for the running device, built on first use (`offline.Slot`)."""
        return self._index.get(lambda: TIER.index(self.name, self.axis_names, device.current()), self._ignored)

    def _ignored(self, index) -> None:
        for problem in index.problems:
            self.fallback(f"artifact ignored: {problem}")

    def _from_offline(self, bound, key, index, kwargs) -> Decision | None:
        hit = index.hit(tuple(key[a] for a in self.axis_names))
        if hit is None:
            if index.other_devices and not index:
                self.fallback(f"no artifact matches this device ({device.current()}); bundled for: "
                              f"{', '.join(sorted(index.other_devices))}")
            return None
        try:
            config = Config.from_json(hit.config, Fields(hit.artifact, ArtifactError))
            self.check_binds(config, set(bound), "config", file=hit.artifact)
            hook = _served_hook(self, config, bound, kwargs, hit.artifact)
        except FlytuneError as e:
            self.fallback(f"artifact {hit.artifact} from {hit.origin} rejected: {e.rule}")
            return None
        return Decision(config, "offline", key, level=hit.level, origin=f"{hit.artifact} ({hit.origin})", hook=hook,
                        pack=hit.pack)

    def forget_pack(self, d: Decision) -> None:
        self.offline_index().refuse(tuple(d.key[a] for a in self.axis_names))
        with self._flights.lock:  # another thread may be storing a decision
            for raw in [raw for raw, v in self._memo.items() if v is d]:
                del self._memo[raw]

    def _from_default(self, bound, key) -> Decision | None:
        config = self.heuristic(returned := self.default(bound), bound, self.fn)
        return Decision(config, "heuristic", key, hook=self.hooks.bind(config, returned))

    def _first_config(self, bound, kwargs, key) -> Decision:
        pruned, made = search.prune(self, bound, kwargs)
        first = first_candidate(pruned, self.configs)
        return Decision(first, "heuristic", key, hook=self.hooks.bind(first, made.get(first)), first=True)

    def toolchain(self) -> dict:
        """Versions, this kernel's source hash and the compiler environment (part of the scratch key)."""
        return identity.toolchain(self.base_fn)

    def scratch_key(self, bound: dict, key: dict) -> str | None:
        """The scratch-cache address of this call's winner; None for a key JSON cannot write (a NaN or
        infinite float axis): such a call has no scratch tier, and runs all the same."""
        try:
            return identity.scratch_key(self.name, key, bound, self.arg_names, device.current(), self.toolchain(),
                                        self.space_hash)
        except ValueError:
            return None

    def decision(self, *args, **kwargs) -> Decision | None:
        """How a call with these arguments was served (None before its first call)."""
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        try:
            return self._memo.get(keys.raw_key(bound, self.axis_names))
        except KeyError:   # a key parameter not passed: no call of these arguments was served
            return None

    @contextlib.contextmanager
    def forcing(self, config):
        """A context in which every call launches `config`, bypassing every tier (verify --execute). It is
        process-wide: every thread's call of this kernel launches `config` meanwhile (counted on the
        forced decision), and no decision begun before it opened or closed is remembered."""
        data = Config.coerce(config)
        forced = Decision(data, "forced", {}, hook=self.hooks.bind(data, config))
        forced.run = _launcher(self._launch, forced.hook)
        self._flights.force(forced)  # the memo set aside: every call misses, and `_decide` answers `forced`
        try:
            yield forced
        finally:
            self._flights.unforce(forced)

    def rediscover(self) -> None:
        self._index.clear()  # built again, from the settings the first decision read

    def _fresh_stats(self) -> None:
        self._stats = Stats()

    def reset(self) -> None:
        """Forget the offline index, then decisions and counters (tests; after changing the environment): a
        decision that read the old index began before the reset of the flights, which drops it."""
        self._index.clear()
        self._scratch = ScratchCache(self.name)
        self._flights.reset(self._fresh_stats)  # with the memo: a decision is in both or neither


def _from_scratch(k: Autotuned, bound: dict, key: dict, kwargs: dict) -> Decision | None:
    """The scratch tier: a winner searched on this machine before, checked before it is trusted. Without
    one for this kernel no address is computed (the kernel's source hash, once per kernel: 1.4-1.6 ms on the dev machine)."""
    if not k._scratch.entries():
        return None
    address = k.scratch_key(bound, key)
    value = None if address is None else k._scratch.get(address)
    if value is None:
        return None
    try:
        config = Config.from_json(value.get("config") if isinstance(value, dict) else value,
                                  Fields(k._scratch.path, ArtifactError))
        k.check_binds(config, set(bound), "config", file=k._scratch.path)  # an artifact's rules: it is data
        if config not in k.config_set and ("early_config_prune" not in k.prune_configs_by
                                           or config not in search.made(k, bound, kwargs)):
            raise ArtifactError("is none of the kernel's declared configs (nor of those its early_config_prune "
                                "makes for this call), among which every search picks its winner",
                                file=k._scratch.path, field="config")
        hook = _served_hook(k, config, bound, kwargs, k._scratch.path)
    except FlytuneError as e:
        warning.once(("scratch-entry", k.name), f"{e}; scratch entry ignored")
        return None
    return Decision(config, "scratch", key, hook=hook)


def _from_search(k: Autotuned, args, kwargs, bound: dict, key: dict, grid, emit: bool) -> Decision:
    """The search tier: search, keep the winner in the scratch cache, and (`emit`) save its artifact."""
    found = search.run(k, args, kwargs, bound, key, grid)
    k._stats.searched(found.seconds)
    winner = found.winner
    address = k.scratch_key(bound, key)
    if address is not None:
        k._scratch.put(address, {"config": winner.config.to_json(), "time_ms": winner.time_ms})
    spec = binder.record(k.name, k.fn, args, kwargs, winner.config)  # for `flytune warmup`
    artifact = Artifact(k.name, key, device.current(), winner.config,
                        identity.provenance(found.candidates, k.space_hash, found.ranking, spec,
                                            measurement=found.measurement, selection=found.selection,
                                            outputs=found.outputs))
    if emit:
        k.emit(artifact)
    search.report(search.Found(k.name, artifact, found.candidates, winner))
    return Decision(winner.config, "scratch", key, first_tier="search", search=found, artifact=artifact,
                    hook=k.hooks.bind(winner.config, found.hook_source))


def _launcher(launch: Callable, hook: Callable | None) -> Callable:
    """What the hot path calls for a decision: `JITFunction.run`, or, for a config with a pre_hook, a
    closure calling the hook (as Triton calls it) and then `run`: a hit never tests for a hook."""
    if hook is None:
        return launch

    def hooked(*args, grid, **launch_kwargs):
        hook(args, {})
        return launch(*args, grid=grid, **launch_kwargs)
    return hooked


def _served_hook(k: Autotuned, config: Config, bound: dict, kwargs: dict, file) -> Callable | None:
    """The pre_hook a config read from the scratch cache or an artifact launches with: its declared
    config's, else, where `early_config_prune` makes configs, the pruner's config with its data for
    this call. An ArtifactError when the pruner's configs for this call carry pre_hooks and `config`
    is none of them: a config is never launched without its hook."""
    hook = k.hooks.bind(config)
    if hook is not None or "early_config_prune" not in k.prune_configs_by:
        return hook
    made = search.made(k, bound, kwargs)   # the pruner alone: which configs carry hooks (no perf_model)
    if config in made:
        return k.hooks.bind(config, made[config])
    if any(getattr(obj, "pre_hook", None) is not None for obj in made.values()):
        raise ArtifactError("is none of the configs early_config_prune makes for this call, which carry "
                            "pre_hooks: a config is never launched without its hook", file=file, field="config")
    return None


def compile_only(kernel, args: tuple, kwargs: dict, grid, decided: Decision | None) -> list:
    """Compile the decided config, or every candidate when None, launching nothing (`Autotuned.warmup`).
    As Triton's warmup, no pre_hook runs: a warm-up changes no tensor (and may be given dtypes). A
    decided offline config that fails to compile raises `ArtifactExecutionError`."""
    if decided is not None:
        todo = [decided.config]
    else:
        bound = {**dict(zip(kernel.arg_names, args)), **kwargs}
        todo = search.declared_order(search.prune(kernel, bound, kwargs)[0], kernel.configs)
    compiled = []
    for cfg in todo:
        try:
            compiled.append(kernel.fn.warmup(*args, grid=grid, **kwargs, **cfg.launch_kwargs()))
        except Exception as e:
            err = launch_error(decided, e, (kernel.arg_names, args, kwargs))
            if err is None:
                raise
            raise err from e
    return compiled


def _positional(arg_names, args: tuple, kwargs: dict) -> tuple:
    """`args` continued by the keyword arguments that follow them in parameter order (popped from `kwargs`)."""
    args = list(args)
    for name in arg_names[len(args):]:
        if name not in kwargs:
            break
        args.append(kwargs.pop(name))
    return tuple(args)


def _raw_key(k: Autotuned, args: tuple, kwargs: dict) -> tuple | None:
    """A call's memo key (each key parameter's dtype or value), the same whichever way it is passed, as
    `_decide` stores it; None when a key parameter is missing (deciding then says which)."""
    try:
        return k._key(args)   # a numpy scalar's misses here: `_decide` keys it (`keys.raw`)
    except IndexError:  # a key parameter came by keyword after one that did not
        bound = {**dict(zip(k.arg_names, args)), **kwargs}
        try:
            return keys.raw_key(bound, k.axis_names)
        except KeyError:
            return None


def _unwrap(fn):
    """The Python function under Triton's wrappers (JITFunction, Heuristics, ...)."""
    found = next((o for o in chain(fn) if inspect.isfunction(o)), None)
    if found is None:
        raise DeclarationError(f"{fn!r} is not a @triton.jit function (nor a wrapper of one): put @autotune "
                               f"above @triton.jit", field="fn")
    return found


def _parameters(names, arg_names, kernel: str, what: str) -> tuple[str, ...]:
    if isinstance(names, str):  # one name, as Triton's `key` takes one: never its characters
        names = [names]
    out = tuple(names or ())
    for i, n in enumerate(out):
        if n not in arg_names:
            raise DeclarationError(f"names {n!r}, which is not a parameter of the kernel" + did_you_mean(n, arg_names),
                                   file=kernel, field=f"{what}[{i}]")
    return out


def kernel(name: str) -> Autotuned | None:
    """The `@autotune` kernel named `name` in this process, or None (`registry.kernel` finds adopted ones too)."""
    k = registry.kernel(name)
    return k if isinstance(k, Autotuned) else None


def kernels() -> dict[str, Autotuned]:
    """Every `@autotune` kernel in this process, by name."""
    return {name: k for name, k in registry.kernels().items() if isinstance(k, Autotuned)}


def stats() -> dict:
    """Per-kernel counters, adopted `@triton.autotune` kernels included: calls per tier, searches, seconds
    searching, fallbacks with reasons; under "torch.compile", how the generated kernels of compiles
    made under `flytune_build.inductor.serve()` were served (runtime.inductor)."""
    out = registry.stats()
    inductor = sys.modules.get("flytune_build.runtime.inductor")  # loaded only by a process that serves compiles
    compiled = inductor.stats() if inductor is not None else None
    if compiled is not None:
        out[inductor.STATS_NAME] = compiled
    return out


def reset_stats() -> None:
    """Reset every kernel's decisions and counters, rediscover bundles and the device (tests). The settings,
    the bundles and the device are read again first: a call deciding meanwhile either began before the
    kernels were reset (its decision is dropped, `Flights`) or reads the new ones."""
    settings.reload()
    TIER.reset()
    device.reset()
    misses = sys.modules.get("flytune_build.runtime.serving.misses")   # where imported at all
    if misses is not None:   # before the kernels: a decision made meanwhile is in the new log, its calls counted
        misses.reset()
    registry.reset()
    inductor = sys.modules.get("flytune_build.runtime.inductor")
    if inductor is not None:
        inductor.reset()
    warning.reset()
