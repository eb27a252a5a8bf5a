"""How Triton's own search of an adopted `@triton.autotune` kernel is timed and recorded: by
`recording` (`flytune tune`) and by an adopted kernel's search tier (FLYTUNE_AUTOTUNE=1 emits its
winners) alike.

Timing (`timed_as_flytune`): with FLYTUNE_RANKING=synthetic each candidate still runs once but is
ranked by `bench.synthetic_ms`; under TRITON_INTERPRET=1, with no `do_bench` of the kernel's own,
candidates are timed on the wall clock (the interpreter has no driver for Triton's benchmarker).
Both are instance attributes set for the search's duration (`Patches`), Triton's code left as it is.
"""
from __future__ import annotations

import math

from ...core import settings
from ...core.artifact import Artifact
from ...core.config import Config, space_hash
from .. import bench, binder, device, identity
from ..bench import Candidate
from .triton_keys import artifact_key

# Triton's own (private) Autotuner attributes this adapter reaches: the method that times one config,
# and the do_bench the decorator was given
TRITON_BENCH, TRITON_USER_BENCH = "_bench", "_do_bench"


class Patches:
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
        self.saved.clear()


def own_timer(tuner):
    """The kernel's own `do_bench`, or None: also when Triton made it from the deprecated `warmup`,
    `rep` or `use_cuda_graph` arguments (a lambda of Triton's, over its GPU benchmarkers)."""
    timer = getattr(tuner, TRITON_USER_BENCH, None)
    return None if timer is None or (getattr(timer, "__module__", None) or "").startswith("triton.") else timer


def can_time(tuner) -> bool:
    """Whether Triton's search of `tuner` can time here as Triton times it: not on the interpreter
    (no driver) unless the kernel brings its own `do_bench`."""
    return not settings.current().interpret or own_timer(tuner) is not None


def timed_as_flytune(tuner, name: str, ranking: str, patches: Patches) -> None:
    """Set the timers a search of `tuner` uses under flytune's settings (the module docstring)."""
    if ranking == "synthetic":
        ranked, timer = _synthetic(tuner, name)
        patches.set(TRITON_BENCH, ranked)
        patches.set("do_bench", timer)
    elif not can_time(tuner):
        patches.set("do_bench", lambda fn, quantiles=None: [bench.cpu_bench(fn)] * 3)


def winner_artifact(tuner, name: str, ranking: str, key: dict, args: tuple, kwargs: dict, winner) -> Artifact:
    """The artifact of the winner Triton's search just chose for a call, with provenance."""
    config = Config.coerce(winner)  # its data: a pre_hook stays in the declaration
    spec = binder.record(name, tuner.fn, args, kwargs, config)  # for `flytune warmup`
    return Artifact(name, key, device.current(), config, provenance(tuner, ranking, spec))


def call_artifact_key(tuner, args: tuple, kwargs: dict) -> dict:
    return artifact_key(tuner, dict(zip(tuner.arg_names, args)), kwargs)


def candidates(tuner) -> list[Candidate]:
    """Every config Triton's last search of `tuner` timed, with its time (its `configs_timings`)."""
    out = []
    for cfg, t in (getattr(tuner, "configs_timings", None) or {}).items():
        t0 = float(t[0] if isinstance(t, (list, tuple)) else t)
        out.append(Candidate(Config.coerce(cfg), t0 if math.isfinite(t0) else math.inf))
    return out


def provenance(tuner, ranking: str, spec: dict | None = None) -> dict:
    return identity.provenance(candidates(tuner), space_hash([Config.coerce(c) for c in tuner.configs]), ranking,
                               spec)


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
