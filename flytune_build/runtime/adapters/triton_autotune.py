"""Adapters for kernels decorated with `@triton.autotune`: they get the offline tier as they are.

`adopt(kernel, name=...)` seeds the Autotuner's in-memory cache with the bundled configs for this
device, keyed exactly as the installed Triton keys it, so a tuned shape benchmarks nothing, and
registers the kernel (`adopted.Adopted`): it reports through `flytune_build.stats()` and
FLYTUNE_PRINT_AUTOTUNING, warns once on a device no artifact matches, honours FLYTUNE_AUTOTUNE=strict
and is checked by `flytune verify --deep`. `recording(kernel, name=...)` captures the winners of
Triton's own search as flytune artifacts. Both take what a library exports: an Autotuner, or a
`@triton.heuristics` wrapper of one (`.fn` is followed down to the Autotuner).

How Triton >= 3.0 keys its cache (`Autotuner.run`): the values of the key arguments passed, then
`str(arg.dtype)` of every passed argument that has a dtype, in the order the call passed them
(positional ones in parameter order, then keywords as written); older releases key on the key values
alone. An artifact of an adopted kernel holds the key arguments plus one axis per other parameter
that was a tensor (its dtype) or None (null, also for a parameter left at a None default): a kernel
called with and without an optional tensor ships both variants under one set of axes. The Triton
key is rebuilt from an artifact in parameter order, nulls skipped, so a seeded key matches calls
that pass their tensors positionally or as keywords in parameter order; a call passing them as
keywords in another order misses that key once, and the seeded config is put under its key then
(`adopted`), with nothing timed.
"""
from __future__ import annotations

import contextlib
import math

from ...core import settings
from ...core.artifact import Artifact
from ...core.config import Config, space_hash
from .. import bench, device, identity, binder
from ..bench import Candidate
from .adopted import Adopted
from .triton_keys import artifact_key, autotuner_of

# Triton's own (private) Autotuner attributes this adapter reaches: the method that times one config,
# and the do_bench the decorator was given
TRITON_BENCH, TRITON_USER_BENCH = "_bench", "_do_bench"


def adopt(kernel, name: str, validate=None) -> int:
    """Seed the Autotuner under `kernel` with every bundled config for this device and register it as
    `name` (`validate(key)`: an optional reference check for `flytune verify --execute`); returns how
    many configs were seeded. On a device no artifact matches it seeds nothing, with one warning naming
    the devices the bundles hold: Triton behaves exactly as before."""
    return Adopted.install(kernel, autotuner_of(kernel), name, validate).seed()


class _Patches:
    """Instance attributes set on an Autotuner for a while; `restore()` puts back exactly what was there."""

    def __init__(self, obj):
        self.obj, self.saved = obj, []

    def set(self, attr: str, value) -> None:
        had = attr in vars(self.obj)
        self.saved.append((attr, had, vars(self.obj).get(attr)))
        setattr(self.obj, attr, value)

    def restore(self) -> None:
        for attr, had, old in reversed(self.saved):
            if had:
                setattr(self.obj, attr, old)
            else:
                delattr(self.obj, attr)


@contextlib.contextmanager
def recording(kernel, name: str):
    """Within the block every search of the Autotuner under `kernel` is captured; yields the list of
    artifacts. The block always searches: the Autotuner's cache (seeded by `adopt`, or from earlier
    calls) is set aside and its disk cache is off, both as they were on exit. With
    FLYTUNE_RANKING=synthetic each candidate still runs once but is ranked by `bench.synthetic_ms`, and
    the artifacts record `ranking: synthetic`; under TRITON_INTERPRET=1, with no `do_bench` of the
    kernel's own, candidates are timed on the wall clock (the interpreter has no device to time)."""
    tuner = autotuner_of(kernel)
    captured: list[Artifact] = []
    ranking = bench.ranking()
    patches = _Patches(tuner)
    saved_cache = dict(tuner.cache)
    tuner.cache.clear()
    adopted = vars(tuner).get("flytune_adopted")
    if adopted is not None:
        adopted.reseed = False
    try:
        patches.set("cache_results", False)
        patches.set("run", _capturing(tuner, name, ranking, captured))
        if ranking == "synthetic":
            ranked, timer = _synthetic(tuner, name)
            patches.set(TRITON_BENCH, ranked)
            patches.set("do_bench", timer)
        elif settings.current().interpret and _own_timer(tuner) is None:
            patches.set("do_bench", lambda fn, quantiles=None: [bench.cpu_bench(fn)] * 3)
        yield captured
    finally:
        patches.restore()
        tuner.cache.clear()
        tuner.cache.update(saved_cache)
        if adopted is not None:
            adopted.reseed = True


def _own_timer(tuner):
    """The kernel's own `do_bench`, or None: also when Triton made it from the deprecated `warmup`,
    `rep` or `use_cuda_graph` arguments (a lambda of Triton's, over its GPU benchmarkers)."""
    timer = getattr(tuner, TRITON_USER_BENCH, None)
    return None if timer is None or (getattr(timer, "__module__", None) or "").startswith("triton.") else timer


def _capturing(tuner, name: str, ranking: str, captured: list):
    original = tuner.run  # the class's, or the wrapper `adopt` installed

    def run(*args, **kwargs):
        before = set(tuner.cache)
        ret = original(*args, **kwargs)
        new = [k for k in tuner.cache if k not in before]
        if new:
            key = artifact_key(tuner, dict(zip(tuner.arg_names, args)), kwargs)
            winner = Config.coerce(tuner.cache[new[-1]])  # its data: a pre_hook stays in the declaration
            spec = binder.record(name, tuner.fn, args, kwargs, winner)  # for `flytune warmup`
            captured.append(Artifact(name, key, device.current(), winner, _provenance(tuner, ranking, spec)))
        return ret
    return run


def _provenance(tuner, ranking: str, spec: dict | None = None) -> dict:
    cands = []
    for cfg, t in (getattr(tuner, "configs_timings", None) or {}).items():
        t0 = float(t[0] if isinstance(t, (list, tuple)) else t)
        cands.append(Candidate(Config.coerce(cfg), t0 if math.isfinite(t0) else math.inf))
    return identity.provenance(cands, space_hash([Config.coerce(c) for c in tuner.configs]), ranking, spec)


def _synthetic(tuner, name: str):
    """Triton's `_bench`, ranking each config by `bench.synthetic_ms` of the call's artifact key."""
    original = getattr(tuner, TRITON_BENCH)
    current = [math.inf]

    def ranked(*args, config, **meta):
        current[0] = bench.synthetic_ms(name, artifact_key(tuner, tuner.nargs, meta), Config.coerce(config))
        return original(*args, config=config, **meta)

    def timer(kernel_call, quantiles=None):
        kernel_call()  # run all the same: a config that cannot launch must not win
        return [current[0]] * 3
    return ranked, timer
