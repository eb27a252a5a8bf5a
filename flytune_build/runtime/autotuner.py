"""`flytune_build.autotune`: Triton's decorator API with tiers scratch -> offline -> heuristic -> search.

The hot path (`Autotuned.run`) is: build the key tuple from positions fixed at decoration time, one
dict lookup, launch. Everything else happens once per distinct key, in `_decide`: the tiers, then
the decision is counted (`decision`), printed when asked and told to `events.on_decision` subscribers.
The search itself is `search`; what a winner depends on and how it was found, `identity`.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any, Callable, Sequence

from ..core import key as keys
from ..core import settings
from ..core.artifact import KERNEL_NAME, Artifact
from ..core.codec import Fields, did_you_mean
from ..core.config import Config, space_hash
from ..core.errors import ArtifactError, ArtifactExecutionError, DeclarationError, FlytuneError
from . import device, events, identity, search, warning
from .decision import TIERS, Decision, Stats
from .offline import TIER
from .scratch import ScratchCache

__all__ = ["autotune", "Autotuned", "Decision", "TIERS", "kernel", "kernels", "stats", "reset_stats"]

_KERNELS: dict[str, "Autotuned"] = {}


def autotune(configs: Sequence[Any], key: Sequence[Any], *, default: Callable[[dict], Any] | None = None,
             prune_configs_by: dict | None = None, reset_to_zero: Sequence[str] | None = None,
             restore_value: Sequence[str] | None = None, warmup: int = 25, rep: int = 100,
             do_bench: Callable[[Callable[[], Any]], float] | None = None, name: str | None = None,
             validate: Callable[..., Any] | None = None):
    """Decorate a `@triton.jit` function; call it as `kernel[grid](*args, **kwargs)` like Triton.

    `default(bound_args) -> config` is the zero-search heuristic tier; `name` (default
    `<module>.<function>`) is the kernel name in artifacts; `validate(bound_args, out_args)` is an
    optional reference check used by `flytune verify --execute`.
    """
    def decorator(fn):
        return Autotuned(fn, configs, key, default=default, prune_configs_by=prune_configs_by,
                         reset_to_zero=reset_to_zero, restore_value=restore_value, warmup=warmup, rep=rep,
                         do_bench=do_bench, name=name, validate=validate)
    return decorator


class Autotuned:
    """A kernel under `@autotune`: `kernel[grid](*args)` launches the config its key's tier chose."""

    def __init__(self, fn, configs, key, *, default, prune_configs_by, reset_to_zero, restore_value, warmup,
                 rep, do_bench, name, validate):
        self.fn = fn
        self._launch = fn.run
        self.base_fn = base = _unwrap(fn)
        self.arg_names = list(getattr(fn, "arg_names", None) or inspect.signature(base).parameters)
        self.name = name or f"{base.__module__}.{base.__name__}"
        Fields(self.name, DeclarationError).string(self.name, "name", KERNEL_NAME, "a dotted Python name", 200)
        self.configs = [Config.coerce(c) for c in configs]
        if not self.configs:
            raise DeclarationError("must hold at least one config", file=self.name, field="configs")
        self.tuned_kwargs = {k: type(v) for c in self.configs for k, v in c.kwargs.items()}
        self.axes = keys.parse_axes(key, self.arg_names, self.name)
        self.axis_names = tuple(a.name for a in self.axes)
        self._key = keys.getter([self.arg_names.index(a) for a in self.axis_names])
        self.reset_to_zero = _parameters(reset_to_zero, self.arg_names, self.name, "reset_to_zero")
        self.restore_value = _parameters(restore_value, self.arg_names, self.name, "restore_value")
        for c in self.configs:
            self.check_binds(c, set(), "configs")
        self.default, self.validate, self.do_bench = default, validate, do_bench
        self.prune_configs_by = prune_configs_by or {}
        self.warmup, self.rep = warmup, rep
        self.space_hash = space_hash(self.configs)
        self.interpreted = type(fn).__module__.endswith("interpreter")
        self._memo: dict[tuple, Decision] = {}
        self.run = self._hot_path()
        self._stats = Stats()
        self._index = None
        self._scratch = ScratchCache(self.name)
        _KERNELS[self.name] = self

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def _hot_path(self):
        """`run`, as a closure over what it needs: a hit is a tuple build, one dict lookup, the launch."""
        memo, key, launch, decide, keywords = self._memo, self._key, self._launch, self._decide, self._run_keywords

        def run(*args, grid, **kwargs):
            if kwargs:
                return keywords(args, kwargs, grid, kwargs.pop("warmup", False))
            try:
                d = memo[key(args)]
            except LookupError:
                d = decide(args, {}, grid)
            d.calls += 1
            try:
                return launch(*args, grid=grid, **d.launch)
            except Exception as e:
                if d.tier == "offline":
                    raise _accepted_failure(d, e) from e
                raise
        return run

    def _run_keywords(self, args, kwargs, grid, warmup):
        args = _positional(self.arg_names, args, kwargs)
        try:
            d = self._memo[self._key(args)]
        except LookupError:
            d = self._decide(args, kwargs, grid)
        d.calls += 1
        try:
            launch = {**d.launch, "warmup": True} if warmup else d.launch
            return self._launch(*args, grid=grid, **kwargs, **launch)
        except Exception as e:
            if d.tier == "offline":
                raise _accepted_failure(d, e) from e
            raise

    def _decide(self, args, kwargs, grid) -> Decision:
        bound = dict(zip(self.arg_names, args))
        bound.update(kwargs)
        missing = [a for a in self.axis_names if a not in bound]
        if missing:
            raise DeclarationError(f"key parameter(s) {', '.join(missing)} were not passed", file=self.name,
                                   field="key")
        raw = tuple(getattr(bound[a], "dtype", bound[a]) for a in self.axis_names)
        index = self.offline_index()
        key = {a.name: keys.bucket(keys.scalar(v), a, index.tuned(a.name, self.axis_names) if a.mode == "nearest"
                                   else None) for a, v in zip(self.axes, raw)}
        mode = settings.current().autotune
        if mode == "search":  # FLYTUNE_AUTOTUNE=1 and `flytune tune`: every new key is searched, its winner emitted
            d = self._from_search(args, kwargs, bound, key, grid, emit=True)
        else:  # the tier order; with search off, the first config stands in for the search
            d = (self._from_scratch(bound, key) or self._from_offline(bound, key, index)
                 or self._from_default(bound, key)
                 or (self._first_config(key) if mode == "off" else
                     self._from_search(args, kwargs, bound, key, grid, emit=False)))
        self._memo[raw] = d
        self._stats.decisions.append(d)
        if settings.current().print_autotuning:
            lvl = f" level={d.level}" if d.level else ""
            print(f"[flytune] {self.name} key={key} tier={d.first_tier}{lvl} config={d.config}", file=sys.stderr)
        events.emit(self.name, d)
        return d

    def offline_index(self):
        """This kernel's offline index for the running device, built on first use."""
        if self._index is None:
            self._index = TIER.index(self.name, self.axis_names, device.current())
            for problem in self._index.problems:
                self._fallback(f"artifact ignored: {problem}")
        return self._index

    def _from_scratch(self, bound, key) -> Decision | None:
        value = self._scratch.get(self.scratch_key(bound, key))
        if value is None:
            return None
        try:
            config = Config.from_json(value.get("config") if isinstance(value, dict) else None,
                                      Fields(self._scratch.path, ArtifactError))
        except FlytuneError as e:
            warning.once(("scratch-entry", self.name), f"{e}; scratch entry ignored")
            return None
        return Decision(config, "scratch", key)

    def _from_offline(self, bound, key, index) -> Decision | None:
        hit = index.hit(tuple(key[a] for a in self.axis_names))
        if hit is None:
            if index.other_devices and not index:
                self._fallback(f"no artifact matches this device ({device.current()}); bundled for: "
                               f"{', '.join(sorted(index.other_devices))}")
            return None
        try:
            config = Config.from_json(hit.config, Fields(hit.artifact, ArtifactError))
            self.check_binds(config, set(bound), "config", file=hit.artifact)
        except FlytuneError as e:
            self._fallback(f"artifact {hit.artifact} from {hit.origin} rejected: {e.rule}")
            return None
        return Decision(config, "offline", key, level=hit.level, origin=f"{hit.artifact} ({hit.origin})")

    def _from_default(self, bound, key) -> Decision | None:
        if self.default is None:
            return None
        config = Config.coerce(self.default(bound))
        self.check_binds(config, set(bound), "default")
        return Decision(config, "heuristic", key)

    def _first_config(self, key) -> Decision:
        self._fallback("FLYTUNE_AUTOTUNE=0 and no heuristic default: using the first config", stacklevel=6)
        return Decision(self.configs[0], "heuristic", key)

    def _from_search(self, args, kwargs, bound, key, grid, emit) -> Decision:
        found = search.run(self, args, kwargs, bound, key, grid)
        self._stats.searched(found.seconds)
        winner = found.winner
        self._scratch.put(self.scratch_key(bound, key), {"config": winner.config.to_json(), "time_ms": winner.time_ms})
        artifact = Artifact(self.name, key, device.current(), winner.config,
                            identity.provenance(found.candidates, self.space_hash, found.ranking))
        out_dir = settings.current().emit_dir
        if emit and out_dir:
            artifact.save(out_dir)
        return Decision(winner.config, "scratch", key, first_tier="search", search=found, artifact=artifact)

    def check_binds(self, config: Config, caller: set, what: str, file=None) -> None:
        """Raise unless `config` binds only tuned, uncalled, non-key parameters with the declared types;
        for an artifact (`file` given, an ArtifactError) it must also set every tuned parameter."""
        f = Fields(file or self.name, ArtifactError if file else DeclarationError)
        for name, value in config.kwargs.items():
            path = f"{what}.kwargs.{name}"
            if name not in self.arg_names:
                f.fail(path, f"binds to no parameter of kernel {self.name}")
            if name in self.axis_names:
                f.fail(path, "overrides a key parameter")
            if name in caller:
                f.fail(path, "overrides an argument the caller passed")
            want = self.tuned_kwargs.get(name)
            if want is not None and type(value) is not want and not (want is float and type(value) is int):
                f.fail(path, f"must be {want.__name__} like the declared configs, not {type(value).__name__}")
        if file is not None:
            unset = set(self.tuned_kwargs) - set(config.kwargs)
            if unset:
                f.fail(f"{what}.kwargs", f"does not set {', '.join(sorted(unset))}")

    def _fallback(self, reason: str, stacklevel: int = 5):
        self._stats.fallback(reason)
        warning.once((self.name, reason), f"flytune: kernel {self.name}: {reason}", stacklevel=stacklevel)

    def toolchain(self) -> dict:
        """Versions, this kernel's source hash and the compiler environment (part of the scratch key)."""
        return identity.toolchain(self.base_fn)

    def scratch_key(self, bound: dict, key: dict) -> str:
        """The scratch-cache address of this call's winner."""
        return identity.scratch_key(self.name, key, bound, self.arg_names, device.current(), self.toolchain(),
                                    self.space_hash)

    def stats(self) -> dict:
        """This kernel's counters (see `flytune_build.stats()`)."""
        return self._stats.render()

    def decision(self, *args, **kwargs) -> Decision | None:
        """How a call with these arguments was served (None before its first call)."""
        try:
            return self._memo.get(self._key(_positional(self.arg_names, args, kwargs)))
        except LookupError:
            return None

    @contextlib.contextmanager
    def forcing(self, config):
        """A context in which every call launches `config`, bypassing every tier (verify --execute)."""
        forced = Decision(Config.coerce(config), "forced", {})
        saved, self._memo = self._memo, _Always(forced)
        self.run = self._hot_path()
        try:
            yield forced
        finally:
            self._memo = saved
            self.run = self._hot_path()

    def reset(self) -> None:
        """Forget decisions, counters and the offline index (tests; after changing the environment)."""
        self._memo.clear()
        self._stats = Stats()
        self._index = None
        self._scratch = ScratchCache(self.name)


class _Always(dict):
    """A memo in which every key is already decided: `forcing`'s."""

    def __init__(self, forced: Decision):
        super().__init__()
        self.forced = forced

    def __missing__(self, key):
        return self.forced


def _positional(arg_names, args: tuple, kwargs: dict) -> tuple:
    """`args` continued by the keyword arguments that follow them in parameter order (popped from `kwargs`)."""
    args = list(args)
    for name in arg_names[len(args):]:
        if name not in kwargs:
            break
        args.append(kwargs.pop(name))
    return tuple(args)


def _unwrap(fn):
    """The Python function under Triton's wrappers (JITFunction, Heuristics, ...)."""
    while not inspect.isfunction(fn):
        fn = fn.fn
    return fn


def _parameters(names, arg_names, kernel: str, what: str) -> tuple[str, ...]:
    out = tuple(names or ())
    for i, n in enumerate(out):
        if n not in arg_names:
            raise DeclarationError(f"names {n!r}, which is not a parameter of the kernel" + did_you_mean(n, arg_names),
                                   file=kernel, field=f"{what}[{i}]")
    return out


def _accepted_failure(d: Decision, e: Exception) -> ArtifactExecutionError:
    return ArtifactExecutionError(f"failed to compile or launch with the accepted artifact {d.origin} "
                                  f"({d.config}): {type(e).__name__}: {e}", file=d.origin, field="config")


def kernel(name: str) -> Autotuned | None:
    """The decorated kernel named `name` in this process, or None."""
    return _KERNELS.get(name)


def kernels() -> dict[str, Autotuned]:
    """Every decorated kernel in this process, by name."""
    return dict(sorted(_KERNELS.items()))


def stats() -> dict:
    """Per-kernel counters: calls per tier, searches, seconds searching, fallbacks with reasons."""
    return {name: k.stats() for name, k in kernels().items()}


def reset_stats() -> None:
    """Reset every kernel's decisions and counters, rediscover bundles and the device (tests)."""
    for k in _KERNELS.values():
        k.reset()
    settings.reload()
    TIER.reset()
    device.reset()
    warning.reset()
