"""`flytune_build.on_decision(callback)`: watch every decision the runtime makes.

A decision is made once per kernel and distinct key, never on the hot path. Each registered callback
is then called, synchronously and in registration order, with one dict (like Triton's
`knobs.autotuning` listeners, an exception in a callback propagates to the call that decided):

    kernel      the kernel's name
    key         the bucketed key, {axis: value}
    tier        the tier that chose: scratch | offline | heuristic | search
    config      the chosen `Config`
    level       the match level (offline tier), else None
    origin      the artifact and where it came from (offline tier), else None

and when a search chose, also `artifact` (the winner as an `Artifact`, with provenance),
`candidates` (every `bench.Candidate` timed, in declared order), `winner` (the winning one) and
`seconds` (the search's wall time). `flytune tune` collects its artifacts through this hook.

`on_decision` returns a `Subscription`: call it, or leave its `with` block, to unregister:

    with flytune_build.on_decision(seen.append):
        kernel[grid](x, y, out, n)
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import settings

if TYPE_CHECKING:
    from .serving.decision import Decision

_subscriptions: list[Subscription] = []


class Subscription:
    """One registered callback. Calling it (or leaving its `with` block) unregisters it; twice is harmless."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[dict], object]):
        self.callback = callback

    def __call__(self) -> None:
        if self in _subscriptions:
            _subscriptions.remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc) -> None:
        self()


def on_decision(callback: Callable[[dict], object]) -> Subscription:
    """Call `callback(event)` for every decision from now on; returns the handle that unregisters it."""
    if not callable(callback):
        raise TypeError(f"on_decision() needs a callable, not {type(callback).__name__}")
    sub = Subscription(callback)
    _subscriptions.append(sub)
    return sub


def announce(kernel: str, d: Decision, miss: bool = True) -> None:
    """One decision made: printed with FLYTUNE_PRINT_AUTOTUNING=1, recorded where FLYTUNE_MISSES asks (`miss`
    False: a search a tuning run made on purpose, `recording`'s), then told to every subscriber (the
    autotuner and adopted kernels call this once per key)."""
    s = settings.current()
    if s.print_autotuning:
        level = f" level={d.level}" if d.level else ""
        print(f"[flytune] {kernel} key={d.key} tier={d.first_tier}{level} config={d.config}", file=sys.stderr)
    if s.misses is not None and miss:
        from . import device
        from .serving import misses

        misses.record(kernel, d, device.current().spec())
    emit(kernel, d)


def emit(kernel: str, d: Decision) -> None:
    """Tell every subscriber how `kernel` will serve `d.key` (the autotuner calls this once per key)."""
    if not _subscriptions:
        return
    event = {"kernel": kernel, "key": d.key, "tier": d.first_tier, "config": d.config, "level": d.level,
             "origin": d.origin}
    if d.search is not None:
        event.update(artifact=d.artifact, candidates=d.search.candidates, winner=d.search.winner,
                     seconds=d.search.seconds)
    tell(event)


def tell(event: dict) -> None:
    """Tell every subscriber `event` (a decision's, or runtime.inductor's: how a generated kernel was served).
    A callback that raises does not keep the others from hearing of it (each decision is told once): every
    subscriber is told, then the first error is raised."""
    error = None
    for sub in tuple(_subscriptions):  # a callback may unregister itself
        try:
            sub.callback(event)
        except Exception as e:  # noqa: BLE001 - raised after the others were told
            error = error or e
    if error is not None:
        raise error
