"""`flytune_build.autotune`: Triton's decorator API with tiers scratch -> offline -> heuristic -> search.

The hot path (`Autotuned.run`) is: build the key tuple from positions fixed at decoration time, one
dict lookup, launch. Everything else happens once per distinct key, in `_decide`.
"""
from __future__ import annotations

import hashlib
import inspect
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core import key as keys
from ..core import settings
from ..core.artifact import KERNEL_NAME, Artifact
from ..core.codec import Fields
from ..core.config import Config, space_hash
from ..core.errors import ArtifactError, ArtifactExecutionError, DeclarationError, FlytuneError
from ..core.version import VERSION as __version__
from . import bench, device, warning
from .offline import TIER
from .scratch import ScratchCache, entry_key

TIERS = ("scratch", "offline", "heuristic", "search")
_KERNELS: dict[str, "Autotuned"] = {}
_listeners: list[Callable[[dict], None]] = []   # `flytune tune` collects search results here


@dataclass(slots=True)
class Decision:
    """How one key is served: the launch kwargs and which tier chose them."""
    config: Config
    tier: str
    key: dict
    level: str | None = None
    origin: str | None = None
    first_tier: str | None = None   # "search" when this winner was searched on first call
    calls: int = 0
    launch: dict = field(init=False)

    def __post_init__(self):
        self.launch = {**self.config.launch_kwargs(), "warmup": False}
        self.first_tier = self.first_tier or self.tier


@dataclass
class _Stats:
    searches: int = 0
    search_seconds: float = 0.0
    fallbacks: dict = field(default_factory=dict)


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
    def __init__(self, fn, configs, key, *, default, prune_configs_by, reset_to_zero, restore_value, warmup,
                 rep, do_bench, name, validate):
        self.fn = fn
        self._launch = fn.run
        self.arg_names = list(getattr(fn, "arg_names", None) or _arg_names(fn))
        base = fn
        while not inspect.isfunction(base):
            base = base.fn
        self.base_fn = base
        self.name = name or f"{base.__module__}.{base.__name__}"
        Fields(self.name, DeclarationError).string(self.name, "name", KERNEL_NAME, "a dotted Python name", 200)
        self.configs = [Config.coerce(c) for c in configs]
        if not self.configs:
            raise DeclarationError("must hold at least one config", file=self.name, field="configs")
        self.tuned_kwargs = {k: type(v) for c in self.configs for k, v in c.kwargs.items()}
        self.axes = keys.parse_axes(key, self.arg_names, self.name)
        self.axis_names = tuple(a.name for a in self.axes)
        self._key = keys.getter([self.arg_names.index(a) for a in self.axis_names])
        self.reset_to_zero = self._names(reset_to_zero, "reset_to_zero")
        self.restore_value = self._names(restore_value, "restore_value")
        for c in self.configs:
            self._check_binds(c, set(), "configs")
        self.default = default
        self.prune_configs_by = prune_configs_by or {}
        self.warmup, self.rep = warmup, rep
        self.do_bench = do_bench
        self.validate = validate
        self.space_hash = space_hash(self.configs)
        self.interpreted = type(fn).__module__.endswith("interpreter")
        self._memo: dict[tuple, Decision] = {}
        self.run = self._hot_path()
        self._decisions: list[Decision] = []
        self._stats = _Stats()
        self._index = None
        self._scratch = ScratchCache(self.name)
        self._toolchain = None
        _KERNELS[self.name] = self

    def _names(self, names, what):
        out = tuple(names or ())
        for i, n in enumerate(out):
            if n not in self.arg_names:
                from ..core.codec import did_you_mean
                raise DeclarationError(f"names {n!r}, which is not a parameter of the kernel"
                                       + did_you_mean(n, self.arg_names), file=self.name, field=f"{what}[{i}]")
        return out

    # -- the hot path -------------------------------------------------------------------------
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
        args = list(args)
        for name in self.arg_names[len(args):]:
            if name not in kwargs:
                break
            args.append(kwargs.pop(name))
        args = tuple(args)
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

    # -- once per key ---------------------------------------------------------------------------
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
        s = settings.current()
        mode = s.autotune
        if mode == "search":
            d = self._search(args, kwargs, bound, key, grid, emit=True)
        else:
            d = (self._from_scratch(bound, key) or self._from_offline(bound, key, index)
                 or self._from_default(bound, key))
            if d is None and mode == "off":
                self._fallback("FLYTUNE_AUTOTUNE=0 and no heuristic default: using the first config")
                d = Decision(self.configs[0], "heuristic", key)
            elif d is None:
                d = self._search(args, kwargs, bound, key, grid, emit=False)
        self._memo[raw] = d
        self._decisions.append(d)
        if s.print_autotuning:
            lvl = f" level={d.level}" if d.level else ""
            print(f"[flytune] {self.name} key={key} tier={d.first_tier}{lvl} config={d.config}", file=sys.stderr)
        return d

    def offline_index(self):
        if self._index is None:
            self._index = TIER.index(self.name, self.axis_names, device.current())
            for problem in self._index.problems:
                self._fallback(f"artifact ignored: {problem}")
        return self._index

    def _from_scratch(self, bound, key) -> Decision | None:
        value = self._scratch.get(self._scratch_key(bound, key))
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
            self._check_binds(config, set(bound), "config", file=hit.artifact)
        except FlytuneError as e:
            self._fallback(f"artifact {hit.artifact} from {hit.origin} rejected: {e.rule}")
            return None
        return Decision(config, "offline", key, level=hit.level, origin=f"{hit.artifact} ({hit.origin})")

    def _from_default(self, bound, key) -> Decision | None:
        if self.default is None:
            return None
        config = Config.coerce(self.default(bound))
        self._check_binds(config, set(bound), "default")
        return Decision(config, "heuristic", key)

    def _check_binds(self, config: Config, caller: set, what: str, file=None):
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

    def _fallback(self, reason: str):
        fb = self._stats.fallbacks
        fb[reason] = fb.get(reason, 0) + 1
        warning.once((self.name, reason), f"flytune: kernel {self.name}: {reason}", stacklevel=5)

    # -- search -------------------------------------------------------------------------------
    def _search(self, args, kwargs, bound, key, grid, emit) -> Decision:
        configs = self._prune(bound, kwargs)
        saved = {n: bound[n].clone() for n in dict.fromkeys(self.restore_value + self.reset_to_zero)}
        rank = bench.ranking()

        def call(cfg: Config):
            for n in self.reset_to_zero:
                bound[n].zero_()
            for n in self.restore_value:
                bound[n].copy_(saved[n])
            self.fn.run(*args, grid=grid, warmup=False, **kwargs, **cfg.launch_kwargs())

        start = time.perf_counter()
        try:
            if not self.interpreted and rank == "measured":
                self._precompile(args, kwargs, grid, configs)
            screen = self._timer(bench.SCREEN_FRACTION)
            candidates = []
            for cfg in configs:
                c = bench.Candidate(cfg)
                try:
                    if rank == "synthetic":
                        call(cfg)
                        c.time_ms = bench.synthetic_ms(self.name, key, cfg)
                    else:
                        c.time_ms = screen(lambda: call(cfg))
                except Exception as e:  # a failing candidate times as infinity
                    c.error = f"{type(e).__name__}: {e}"
                candidates.append(c)
            if rank == "synthetic":
                winner = bench.pick(candidates, lambda c: bench.synthetic_ms(self.name, key, c.config))
            else:
                retime = self._timer(bench.TIE_ROUNDS)
                winner = bench.pick(candidates, lambda c: retime(lambda: call(c.config)))
        finally:
            for n, t in saved.items():
                bound[n].copy_(t)
        elapsed = time.perf_counter() - start
        self._stats.searches += 1
        self._stats.search_seconds += elapsed
        if settings.current().print_autotuning:
            for c in candidates:
                t = f"{c.time_ms:.4f} ms" if math.isfinite(c.time_ms) else f"failed ({c.error})"
                print(f"[flytune]   {c.config}: {t}", file=sys.stderr)
            print(f"[flytune] {self.name} search took {elapsed:.3f} s", file=sys.stderr)
        self._scratch.put(self._scratch_key(bound, key), {"config": winner.config.to_json(),
                                                          "time_ms": winner.time_ms})
        artifact = Artifact(self.name, key, device.current(), winner.config,
                            self._provenance(candidates, rank))
        out_dir = settings.current().emit_dir
        if emit and out_dir:
            artifact.save(out_dir)
        for listener in _listeners:
            listener({"kernel": self.name, "artifact": artifact, "candidates": candidates, "winner": winner,
                      "seconds": elapsed})
        return Decision(winner.config, "scratch", key, first_tier="search")

    def _timer(self, fraction: int = 1):
        if self.do_bench is not None:
            def user(fn):
                t = self.do_bench(fn)
                return float(t[0] if isinstance(t, (list, tuple)) else t)
            return user
        fn = bench.default_bench(self.interpreted)
        warmup, rep = max(self.warmup // fraction, 1), max(self.rep // fraction, 1)
        return lambda call: fn(call, warmup, rep)

    def _prune(self, bound, kwargs) -> list[Config]:
        configs = self.configs
        early = self.prune_configs_by.get("early_config_prune")
        if early is not None:
            configs = [Config.coerce(c) for c in early(configs, bound, **kwargs)]
            if not configs:
                raise DeclarationError("early_config_prune returned no config", file=self.name,
                                       field="prune_configs_by")
        model, top_k = self.prune_configs_by.get("perf_model"), self.prune_configs_by.get("top_k")
        if model is not None and top_k:
            k = int(len(configs) * top_k) if isinstance(top_k, float) else int(top_k)
            configs = sorted(configs, key=lambda c: model(**bound, **kwargs, **c.launch_kwargs()))[:max(k, 1)]
        return configs

    def _precompile(self, args, kwargs, grid, configs):
        """Compile every candidate concurrently before timing any (Triton compiles on worker threads)."""
        try:
            from concurrent.futures import ThreadPoolExecutor

            from triton.runtime._async_compile import AsyncCompileMode
        except ImportError:
            return
        try:
            self._precompile_with(ThreadPoolExecutor, AsyncCompileMode, args, kwargs, grid, configs)
        except Exception as e:  # compiling lazily, one by one, is slower but still right
            warning.once(("precompile", self.name), f"flytune: concurrent precompile unavailable ({e}); "
                         "candidates compile one by one")

    def _precompile_with(self, ThreadPoolExecutor, AsyncCompileMode, args, kwargs, grid, configs):
        with ThreadPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 4)) as pool:
            with AsyncCompileMode(pool, ignore_errors=True):
                for cfg in configs:
                    try:
                        self.fn.warmup(*args, grid=grid, **kwargs, **cfg.launch_kwargs())
                    except Exception:
                        pass  # the timed pass reports the failure

    # -- identities -------------------------------------------------------------------------------
    def toolchain(self) -> dict:
        if self._toolchain is None:
            import torch
            import triton

            try:
                src = inspect.getsource(self.base_fn)
            except (OSError, TypeError):
                src = self.base_fn.__qualname__
            try:
                from triton._C.libtriton import get_cache_invalidating_env_vars
                env = dict(sorted(get_cache_invalidating_env_vars().items()))
            except Exception:
                env = settings.triton_env()
            self._toolchain = {
                "flytune": __version__, "triton": triton.__version__, "torch": torch.__version__,
                "cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None),
                "source": hashlib.sha256(src.encode()).hexdigest(), "env": env,
            }
        return self._toolchain

    def _scratch_key(self, bound, key) -> str:
        layout = []
        for name in self.arg_names:
            v = bound.get(name)
            if hasattr(v, "stride") and hasattr(v, "dtype"):
                layout.append([name, keys.scalar(v.dtype), [0 if s == 0 else 1 if s == 1 else 2 for s in v.stride()]])
        return entry_key({"kernel": self.name, "key": key, "layout": layout, "device": device.current().spec(),
                          "toolchain": self.toolchain(), "space": self.space_hash})

    def _provenance(self, candidates, rank) -> dict:
        tc = self.toolchain()
        return {"flytune": __version__, "triton": tc["triton"], "torch": tc["torch"], "cuda": tc["cuda"],
                "hip": tc["hip"], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "space_hash": self.space_hash, "ranking": rank,
                "candidates": [c.to_json() for c in candidates]}

    # -- observability ---------------------------------------------------------------------------
    def stats(self) -> dict:
        calls = dict.fromkeys(TIERS, 0)
        levels: dict[str, int] = {}
        for d in self._decisions:
            if d.calls:
                calls[d.first_tier] += 1
                calls[d.tier] += d.calls - 1
                if d.tier == "offline":
                    levels[d.level] = levels.get(d.level, 0) + d.calls
        s = self._stats
        return {"calls": calls, "offline_levels": levels, "searches": s.searches,
                "search_seconds": s.search_seconds, "fallbacks": dict(s.fallbacks)}

    def decision(self, *args, **kwargs) -> Decision | None:
        """How a call with these arguments was served (None before its first call)."""
        args = list(args)
        for name in self.arg_names[len(args):]:
            if name not in kwargs:
                break
            args.append(kwargs[name])
        try:
            return self._memo.get(self._key(tuple(args)))
        except LookupError:
            return None

    def forcing(self, config):
        """A context in which every call launches `config`, bypassing every tier (verify --execute)."""
        import contextlib

        forced = Decision(Config.coerce(config), "forced", {})

        class _Always(dict):
            def __missing__(self, key):
                return forced

        @contextlib.contextmanager
        def ctx():
            saved = self._memo
            self._memo = _Always()
            self.run = self._hot_path()
            try:
                yield forced
            finally:
                self._memo = saved
                self.run = self._hot_path()
        return ctx()

    def reset(self) -> None:
        """Forget decisions, counters and the offline index (tests; after changing the environment)."""
        self._memo.clear()
        self._decisions.clear()
        self._stats = _Stats()
        self._index = None
        self._scratch = ScratchCache(self.name)


def _accepted_failure(d: Decision, e: Exception) -> ArtifactExecutionError:
    return ArtifactExecutionError(f"failed to compile or launch with the accepted artifact {d.origin} "
                                  f"({d.config}): {type(e).__name__}: {e}", file=d.origin, field="config")


def _arg_names(fn) -> list[str]:
    base = fn
    while not inspect.isfunction(base):
        base = base.fn
    return list(inspect.signature(base).parameters)


def stats() -> dict:
    """Per-kernel counters: calls per tier, searches, seconds searching, fallbacks with reasons."""
    return {name: k.stats() for name, k in sorted(_KERNELS.items())}


def reset_stats() -> None:
    """Reset every kernel's decisions and counters, rediscover bundles and the device (tests)."""
    for k in _KERNELS.values():
        k.reset()
    settings.reload()
    TIER.reset()
    device.reset()
    warning.reset()
