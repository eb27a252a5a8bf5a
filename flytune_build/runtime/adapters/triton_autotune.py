"""Adapters for kernels decorated with `@triton.autotune`: they get the offline tier as they are.

`adopt(kernel, name=...)` gives the Autotuner an offline tier: the bundled configs for this device,
put into its in-memory cache on each key's first call, keyed exactly as the installed Triton keys
it, so a tuned shape benchmarks nothing; and registers the kernel (`adopted.Adopted`): it reports
through `flytune_build.stats()` and FLYTUNE_PRINT_AUTOTUNING, warns once on a device no artifact
matches, follows FLYTUNE_AUTOTUNE as a ported kernel does (`runtime.serving.kernel`) and is checked by
`flytune verify --deep`. `recording(kernel, name=...)` captures Triton's own searches as flytune
artifacts, each winner chosen over Triton's timings by flytune's selection rule (`triton_search.select`). Both take what a library exports: an Autotuner, or a
`@triton.heuristics` wrapper of one (`.fn` is followed down to the Autotuner).

How Triton >= 3.0 keys its cache (`Autotuner.run`): the values of the key arguments passed, then
`str(arg.dtype)` of every passed argument that has a dtype, in the order the call passed them
(positional ones in parameter order, then keywords as written); older releases key on the key values
alone. An artifact of an adopted kernel holds the key arguments plus one axis per other parameter
that was a tensor (its dtype) or None (null, also for a parameter left at a None default): a kernel
called with and without an optional tensor ships both variants under one set of axes. On a Triton
key's first call (its cache miss) the call's artifact key, which does not depend on the order the
tensors were passed in, finds the artifact; its config is put under the call's Triton key then
(`adopted`), with nothing timed.
"""
from __future__ import annotations

import contextlib
import os
import threading

from ...core.artifact import Artifact
from ...core.errors import DeclarationError, UsageError
from ..searching import bench, search
from .adopted import Adopted
from ..wrapping import chain
from .triton_keys import autotuner_of
from .triton_search import Checking, Patches, call_artifact_key, select, timed_as_flytune, winner_artifact


def adopt(kernel, name: str, validate=None) -> int:
    """Register the Autotuner under `kernel` as `name`, its offline tier the bundled configs for this
    device (`validate(key)`: an optional reference check for `flytune verify --execute`); returns how
    many configs it holds. On a device no artifact matches it holds none, with one warning naming the
    devices the bundles hold. FLYTUNE_AUTOTUNE binds it as it binds ported kernels (`runtime.serving.kernel`)."""
    return Adopted.install(kernel, autotuner_of(kernel), name, validate).seed()


@contextlib.contextmanager
def recording(kernel, name: str):
    """Within the block every search of the Autotuner under `kernel` is captured; yields the list of
    artifacts. Each winner is flytune's selection over the candidates Triton timed (re-timed in rounds;
    hysteresis against the output's winner where the tuning session holds one (`runtime.searching.session`); the first config Triton timed
    kept unless beaten by the margin), put into Triton's cache for the process's later calls. The block always searches: the Autotuner's cache (what `adopt` seeded, or earlier
    calls decided) is set aside and its disk cache is off, both as they were on exit. With
    FLYTUNE_RANKING=synthetic each candidate still runs once but is ranked by `bench.synthetic_ms`, and
    the artifacts record `ranking: synthetic`; under TRITON_INTERPRET=1, with no `do_bench` of the
    kernel's own, candidates are timed on the wall clock (`triton_search`). Inside
    a tuning session that checks outputs (`flytune tune`) each candidate's outputs are checked first
    (`triton_search.Checking`): one that differs from the reference is never timed and cannot win.
    The block patches the Autotuner itself: every thread's call of the kernel meanwhile is searched and
    captured, one call at a time (Triton's search and flytune's selection read the Autotuner's own state:
    its timings, its `best_config`), and a second block on the same kernel (nested, or on another thread)
    is a UsageError. A process forked meanwhile by another thread than the block's has the kernel as it
    was before the block (no thread of the child would end it)."""
    tuner = autotuner_of(kernel)
    if not isinstance(tuner.cache, dict):  # set aside and restored below, as a dict
        raise DeclarationError(f"keeps its Autotuner's cache in a {type(tuner.cache).__name__}, not a dict: its "
                               f"searches cannot be recorded", file=name, field="cache")
    block = _Block()
    if _RECORDING.setdefault(id(tuner), block) is not block:   # one step under the GIL: one block wins
        raise UsageError(f"{name}: its searches are already being recorded (a `recording` block on this or "
                         f"another thread patches the Autotuner itself): one block at a time per kernel")
    try:
        with _recorded(kernel, tuner, name, block) as captured:
            yield captured
    finally:
        _RECORDING.pop(id(tuner), None)


class _Block:
    """One `recording` block: its thread, what puts the Autotuner back as it was (`undo`, once), and the
    lock its calls take one at a time (`serial`; new in a child, where its holder may be no thread)."""

    def __init__(self):
        self.thread, self.undo, self.serial = threading.get_ident(), None, threading.RLock()


_RECORDING: dict = {}   # id(an Autotuner) -> the `recording` block that holds it


def _after_fork() -> None:
    """A child forked by another thread than a block's has no thread to end that block: undone here. A
    block the forking thread holds goes on in the child, its calls' lock new (another thread's call may
    have held it: that thread is not in the child)."""
    for key, block in list(_RECORDING.items()):
        if block.thread != threading.get_ident() and block.undo is not None:
            block.undo()
            _RECORDING.pop(key, None)
        else:
            block.serial = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)


@contextlib.contextmanager
def _recorded(kernel, tuner, name: str, block: _Block):
    captured: list[Artifact] = []
    ranking = bench.ranking()
    patches = Patches(tuner)
    saved_cache = dict(tuner.cache)
    tuner.cache.clear()
    adopted = vars(tuner).get("flytune_adopted")
    if adopted is not None:
        adopted.reseed = False

    def undo() -> None:
        block.undo = None
        watched = getattr(vars(tuner).get("do_bench"), "restore", None)   # a timing in flight (`triton_search`)
        if watched is not None:
            watched()
        patches.restore()
        tuner.cache.clear()
        tuner.cache.update(saved_cache)
        if adopted is not None:
            adopted.reseed = True
    block.undo = undo
    try:
        patches.set("cache_results", False)
        timed_as_flytune(tuner, name, ranking, patches)
        patches.set("run", _capturing(tuner, name, ranking, captured, Checking(tuner, patches, heuristics(kernel, tuner)),
                                      block))
        yield captured
    finally:
        if block.undo is not None:
            undo()


def heuristics(kernel, tuner) -> frozenset:
    """The names `@triton.heuristics` wrappers between `kernel` and its Autotuner add to each call's
    keywords: meta-parameters, not arguments the caller passed."""
    names: set = set()
    for k in chain(kernel):
        if k is tuner:
            break
        values = getattr(k, "values", None)
        if isinstance(values, dict):
            names.update(values)
    return frozenset(names)


def _capturing(tuner, name: str, ranking: str, captured: list, checking: Checking, block: _Block):
    original = tuner.run  # the class's, or the wrapper `adopt` installed
    adopted = vars(tuner).get("flytune_adopted")

    def run(*args, **kwargs):
        with block.serial:   # one call at a time (a call nested in a hook on the same thread, too)
            before = set(tuner.cache)
            if adopted is not None:   # what an earlier call that failed meanwhile left is not this call's
                adopted.local.recorded = None
            checking.call(args, kwargs)
            try:
                ret = original(*args, **kwargs)
                new = [k for k in tuner.cache if k not in before]
                if new:
                    key = call_artifact_key(tuner, args, kwargs)
                    picked = select(tuner, name, ranking, key, args, kwargs, checking)
                    tuner.cache[new[-1]] = tuner.best_config = picked.winner   # later calls run flytune's winner too
                    if adopted is not None:   # counted and told as the config it serves, not Triton's pick
                        adopted.recorded(picked.winner)
                    launched = checking.launch_winner(picked.winner, args, kwargs)
                    ret = ret if launched is None else launched
                    art = winner_artifact(tuner, name, ranking, key, args, kwargs, picked.winner, picked)
                    captured.append(art)
                    search.report(search.Found(name, art, picked.candidates, picked.selection.winner))
            finally:
                checking.close()
            return ret
    return run
